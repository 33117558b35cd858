"""Mixture-of-experts models (Qwen3-MoE, Mixtral) against transformers in fp32, batch invariance of the
routing, and the refusals of what is not supported yet (GGUF MoE files, other MoE families, LoRA on experts)."""
from __future__ import annotations

import json

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from engine.model.config import ModelConfig
from engine.model.catalog.info import read_model_info
from engine.model.lora import LoRA
from tests.engine.test_model_peer import (GREEDY_TOKENS, TINY_ATOL, assert_same_greedy, greedy_hf, hf_logits, hf_model,
                                          prompt_ids)
from tests.tiny_models import write_tiny_gguf, write_tiny_model
from tools.logits import forward_tokens

GREEDY = SamplerSettings.greedy()
# (arch, config overrides): Qwen3-MoE with and without renormalised top-k weights, Mixtral
CASES = {"qwen3moe": ("qwen3moe", {}), "qwen3moe-unnormed": ("qwen3moe", {"norm_topk_prob": False}),
         "mixtral": ("mixtral", {})}


@pytest.fixture(scope="module", params=list(CASES))
def tiny_moe(request, tmp_path_factory):
    arch, extra = CASES[request.param]
    folder = write_tiny_model(tmp_path_factory.mktemp("moe") / request.param, arch, tie=False,
                              seed=list(CASES).index(request.param), **extra)
    return folder, Model.load(folder, device="cpu", dtype=torch.float32)


def run_greedy(model, tok, prompts: list[torch.Tensor], n: int) -> list[list[int]]:
    """Greedy tokens of every prompt, all enqueued together in one paged generator."""
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), tok)
    jobs = [DynamicJob(p, n, gen_settings=GREEDY) for p in prompts]
    out = {id(j): [] for j in jobs}
    gen.enqueue(jobs)
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                out[id(r["job"])] += r["token_ids"]
    return [out[id(j)] for j in jobs]


def test_config_reads_the_experts(tiny_moe):
    folder, model = tiny_moe
    c, cfg = model.config, json.loads((folder / "config.json").read_text())
    assert c.num_experts == 8 and c.experts_per_token == 2
    if c.arch == "qwen3moe":  # mlp_only_layers=[1]: the middle layer is a dense MLP of intermediate_size
        assert c.sparse_layers == [True, False, True] and c.moe_intermediate_size == 32
        assert model.layers[1].moe is None and model.layers[1].gate_up.shape == (256, 64)
        assert c.norm_topk_prob == cfg["norm_topk_prob"]
    else:
        assert c.sparse_layers is None and c.norm_topk_prob and c.moe_intermediate_size == 32
    sparse = [layer for layer in model.layers if layer.moe is not None]
    assert sparse and all(len(layer.moe.gate_up) == 8 and layer.gate_up is None for layer in sparse)
    # every parameter counted once: the checkpoint's own total
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", "pt") as f:
        total = sum(torch.Size(f.get_slice(k).get_shape()).numel() for k in f.keys())
    assert model.num_parameters() == total
    info = read_model_info(folder)  # and the header-only facts: total, and what one token computes with
    assert info.supported and info.params == total
    assert info.active_params == total - len(sparse) * (8 - 2) * 3 * 64 * 32


def test_tiny_moe_logits_and_greedy_match_transformers(tiny_moe):
    """One forward pass over prompt + transformers' greedy continuation: fp32 logits as tight as the dense
    architectures', and greedy decoding picks the same tokens."""
    folder, ours = tiny_moe
    theirs = hf_model(folder)
    ids = prompt_ids(40, seed=1)
    continuation = greedy_hf(theirs, ids, GREEDY_TOKENS)
    assert len(set(continuation)) > 3
    full = torch.cat([ids, torch.tensor([continuation])], dim=1)
    a, b = forward_tokens(ours, full), hf_logits(theirs, full)
    assert (a - b).abs().max().item() < TINY_ATOL, (a - b).abs().max().item()
    assert_same_greedy(a, ids.shape[1], continuation)
    # the routing is real: the rows spread over most experts in every sparse layer
    h = torch.randn(64, ours.config.hidden_size, generator=torch.Generator().manual_seed(0))
    for layer in ours.layers:
        if layer.moe is not None:
            assert len(layer.moe.route(h)[1].unique()) >= 6


def test_tiny_moe_generator_greedy_equals_transformers(tiny_moe):
    """Through the paged generator (chunked prompt, one token per step after): transformers' greedy tokens."""
    folder, model = tiny_moe
    ids = prompt_ids(40, seed=2)
    (ours,) = run_greedy(model, Tokenizer.load(folder), [ids], 24)
    assert ours == greedy_hf(hf_model(folder), ids, 24)


def test_moe_batch_does_not_change_experts_or_output(tiny_moe):
    """A row's experts and its block output are the same alone and in any batch (rows are grouped by expert,
    so each expert's matmul sees a different set of rows); jobs batched together decode as they do alone."""
    folder, model = tiny_moe
    block = next(layer.moe for layer in model.layers if layer.moe is not None)
    h = torch.randn(24, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    together_w, together_e = block.route(h)
    together = block(h)
    for i in (0, 7, 23):
        alone_w, alone_e = block.route(h[i:i + 1])
        assert torch.equal(alone_e[0], together_e[i])
        torch.testing.assert_close(alone_w[0], together_w[i], rtol=0, atol=1e-6)
        torch.testing.assert_close(block(h[i:i + 1])[0], together[i], rtol=0, atol=1e-5)
    shuffled = torch.randperm(24, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(block(h[shuffled]), together[shuffled], rtol=0, atol=1e-5)
    tok = Tokenizer.load(folder)
    prompts = [prompt_ids(5 + 11 * i, seed=10 + i) for i in range(5)]
    alone = [run_greedy(model, tok, [p], 16)[0] for p in prompts]
    assert run_greedy(model, tok, prompts, 16) == alone


def test_q8_packs_every_expert_and_the_estimate_equals_what_loads(tmp_path):
    """weights="q8" quantizes each expert like any projection (the router stays dense), and the memory
    estimate still equals what loading holds."""
    from engine import estimate_memory
    from engine.model.qlinear import Q8Linear

    folder = write_tiny_model(tmp_path / "q", "qwen3moe", tie=False, seed=7)
    model = Model.load(folder, device="cpu", dtype=torch.float32, weights="q8")
    block = model.layers[0].moe
    assert all(isinstance(w, Q8Linear) for w in block.gate_up + block.down)
    assert isinstance(block.router, torch.Tensor)
    assert estimate_memory(folder, weights="q8").weights_bytes == model.memory_bytes()
    dense = Model.load(folder, device="cpu", dtype=torch.float32)
    ids = prompt_ids(24, seed=8)
    a, b = forward_tokens(model, ids), forward_tokens(dense, ids)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.7  # 8-bit weights and activations: mostly the same picks


# ---------------------------------------------------------------- GGUF (llama.cpp's layout: 3-D expert tensors)

def test_tiny_qwen3moe_gguf_matches_transformers_on_the_source_folder(tmp_path):
    """A qwen3moe GGUF (router ffn_gate_inp, experts stacked in ffn_{gate,up,down}_exps, expert_count /
    expert_used_count / expert_feed_forward_length; every layer sparse, as llama.cpp has it) gives the HF
    folder's logits and greedy tokens; the memory estimate equals what loading holds."""
    from engine import estimate_memory

    folder = write_tiny_model(tmp_path / "q", "qwen3moe", tie=True, seed=5, mlp_only_layers=[])
    path = write_tiny_gguf(folder, tmp_path / "q.gguf", "F32", tokenizer=False)
    ours, theirs = Model.load(path, device="cpu", dtype=torch.float32), hf_model(folder)
    c = ours.config
    assert (c.arch, c.num_experts, c.experts_per_token, c.moe_intermediate_size, c.sparse_layers) == (
        "qwen3moe", 8, 2, 32, None)
    ids = prompt_ids(40, seed=6)
    continuation = greedy_hf(theirs, ids, GREEDY_TOKENS)
    full = torch.cat([ids, torch.tensor([continuation])], dim=1)
    a, b = forward_tokens(ours, full), hf_logits(theirs, full)
    assert (a - b).abs().max().item() < TINY_ATOL, (a - b).abs().max().item()
    assert_same_greedy(a, ids.shape[1], continuation)
    assert estimate_memory(path, weights="dense").weights_bytes == ours.memory_bytes()


def test_quantized_3d_expert_tensors_dequantize_as_gguf_py_does(tmp_path):
    import gguf

    from engine.model.gguf.file import GGUFFile

    x = torch.randn(4, 32, 64, generator=torch.Generator().manual_seed(0))
    q8 = gguf.GGMLQuantizationType.Q8_0
    blocks = gguf.quants.quantize(x.numpy(), q8)
    w = gguf.GGUFWriter(str(tmp_path / "e.gguf"), "qwen3moe")
    w.add_tensor("blk.0.ffn_up_exps.weight", blocks, raw_dtype=q8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = GGUFFile(tmp_path / "e.gguf", header_only=True).tensor("blk.0.ffn_up_exps.weight")
    assert torch.equal(got, torch.from_numpy(gguf.quants.dequantize(blocks, q8)))


# ---------------------------------------------------------------- refusals

def test_other_moe_families_are_refused_by_name():
    cfg = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 60,
           "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100,
           "intermediate_size": 64}
    with pytest.raises(NotImplementedError,
                       match=r"qwen2_moe is a mixture-of-experts model \(60 experts\) of a family .*Qwen3-MoE .*Mixtral"):
        ModelConfig.from_hf(cfg)


def test_gguf_moe_files_of_other_families_are_refused_by_name(tmp_path):
    """Mixtral GGUFs (llama.cpp writes them as "llama" with experts) are not read yet."""
    import gguf

    path = tmp_path / "moe.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.expert_count", 8)
    w.add_uint32("llama.expert_used_count", 2)
    w.add_tensor("token_embd.weight", torch.zeros(16, 8).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # (the memory check reads the config first and passes its message on as a ValueError)
    with pytest.raises((ValueError, NotImplementedError),
                       match=r"mixture-of-experts model \(8 experts\) in a GGUF file, which is not supported yet"):
        Model.load(path, device="cpu", dtype=torch.float32)


def test_lora_on_experts_is_refused_and_on_attention_loads(tiny_moe):
    _, model = tiny_moe
    h, r = model.config.hidden_size, 2
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 4, "target_modules": ["q_proj", "gate_proj"]}
    q = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(r, h),
         "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(64, r)}
    assert LoRA.from_state_dict(cfg, q, model).weights  # attention-only: fine
    name = ("mlp.experts.3.gate_proj" if model.config.arch == "qwen3moe" else "block_sparse_moe.experts.3.w1")
    experts = {**q, f"base_model.model.model.layers.0.{name}.lora_A.weight": torch.ones(r, h),
               f"base_model.model.model.layers.0.{name}.lora_B.weight": torch.ones(32, r)}
    with pytest.raises(ValueError, match="mixture-of-experts MLP of layer 0; LoRA on experts"):
        LoRA.from_state_dict(cfg, experts, model)

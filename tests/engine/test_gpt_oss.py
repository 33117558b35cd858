"""gpt-oss against transformers in fp32: a tiny random GptOssForCausalLM (biased router and experts, top-k
then softmax routing, clamped SwiGLU, attention sinks, q/k/v/o biases, sliding and full layers alternating,
YaRN rope) loaded from its HF folder and from a llama.cpp-layout GGUF, its logits and greedy tokens equal
transformers'; each gpt-oss feature matters (turning it off moves the logits far beyond the tolerance);
attention sinks in the torch reference, the C++ attention kernel and the Triton kernels (the CUDA path)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import kernels
from engine import Model, estimate_memory
from engine.model.moe import MoEBlock
from tests.engine.test_model_peer import (GREEDY_TOKENS, TINY_ATOL, assert_same_greedy, greedy_hf, hf_logits, hf_model,
                                          prompt_ids)
from tests.tiny_models import WEIGHT_STD, default_tokenizer
from tools.logits import forward_tokens

WINDOW = 16  # shorter than the prompts, so the sliding layers' window matters
YARN = {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 64, "rope_theta": 150000.0}
LIMIT = 2.0  # the SwiGLU clamp, low enough that the tiny model's activations reach it


def gpt_oss_config(**overrides):
    import transformers

    vocab = overrides.get("vocab_size") or default_tokenizer().vocab_size
    kwargs = dict(vocab_size=vocab, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                  sliding_window=WINDOW, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  rope_parameters=dict(YARN), swiglu_limit=LIMIT, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    kwargs.update(overrides)
    return transformers.GptOssConfig(**kwargs)


def write_gpt_oss(folder: Path, seed: int = 0, tokenizer: bool = True, **overrides) -> Path:
    """A tiny random gpt-oss HF folder (weights spread wide, as tests.tiny_models draws them; the default
    tokenizer unless `tokenizer` is False)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(gpt_oss_config(**overrides), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("sinks"):
                p.normal_(1.0, 1.0)  # around the scores' size: a sink takes a real share of each softmax
            else:
                p.normal_(0.0, WEIGHT_STD if p.dim() > 1 else 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer:
        default_tokenizer().save(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = write_gpt_oss(tmp_path_factory.mktemp("gpt-oss") / "hf")
    return folder, Model.load(folder, device="cpu", dtype=torch.float32), hf_model(folder)


def test_config_reads_gpt_oss(tiny):
    folder, model, _ = tiny
    c = model.config
    assert c.arch == "gpt-oss" and c.num_experts == 8 and c.experts_per_token == 2 and c.moe_intermediate_size == 32
    assert c.router_bias and c.expert_bias and c.moe_routing == "topk_softmax"
    assert c.swiglu_limit == LIMIT and c.swiglu_alpha == 1.702
    assert c.attention_sinks and c.attention_bias and c.output_bias
    assert c.layer_types == ["sliding_attention", "full_attention"] * 2 and c.sliding_window == WINDOW
    assert [layer.window for layer in model.layers] == [WINDOW, None, WINDOW, None]
    assert c.rope_scaling["rope_type"] == "yarn" and c.rope_scaling["truncate"] is False
    assert c.rope_attention_factor == pytest.approx(0.1 * np.log(8.0) + 1)
    # every parameter counted once: the checkpoint's own total
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", "pt") as f:
        total = sum(f.get_tensor(k).numel() for k in f.keys())
    assert model.num_parameters() == total


def assert_matches_transformers(ours: Model, theirs, ids: torch.Tensor) -> None:
    """fp32 logits within TINY_ATOL of transformers' over the prompt and transformers' greedy reply, and
    the same greedy tokens."""
    continuation = greedy_hf(theirs, ids, GREEDY_TOKENS)
    full = torch.cat([ids, torch.tensor([continuation])], dim=1)
    a, b = forward_tokens(ours, full), hf_logits(theirs, full)
    assert (a - b).abs().max().item() < TINY_ATOL, (a - b).abs().max().item()
    assert_same_greedy(a, ids.shape[1], continuation)


def test_logits_and_greedy_match_transformers(tiny):
    _, ours, theirs = tiny
    assert_matches_transformers(ours, theirs, prompt_ids(40, seed=1))  # past the sliding window (16)


def test_paged_generation_matches_transformers(tiny):
    """Through the paged generator: prompts of different lengths enqueued together (batched decode steps,
    chunked prefill), each one's greedy tokens transformers'."""
    from tests.engine.test_moe import run_greedy

    _, ours, theirs = tiny
    prompts = [prompt_ids(n, seed=10 + n) for n in (5, 23, 40)]
    replies = run_greedy(ours, default_tokenizer(), prompts, GREEDY_TOKENS)
    assert replies == [greedy_hf(theirs, p, GREEDY_TOKENS) for p in prompts]


def _far(ours: Model, ids: torch.Tensor, expected: torch.Tensor) -> bool:
    return (forward_tokens(ours, ids) - expected).abs().max().item() > 100 * TINY_ATOL


@pytest.mark.parametrize("feature", ["sinks", "o_bias", "expert_bias", "router_bias", "routing", "clamp", "yarn",
                                     "window"])
def test_each_gpt_oss_feature_matters(tmp_path, feature):
    """The peer test can fail: dropping any one gpt-oss feature moves the logits far beyond tolerance."""
    folder = write_gpt_oss(tmp_path / "hf", seed=3)
    ours, ids = Model.load(folder, device="cpu", dtype=torch.float32), prompt_ids(40, seed=2)
    expected = hf_logits(hf_model(folder), ids)
    assert (forward_tokens(ours, ids) - expected).abs().max().item() < TINY_ATOL
    sparse: list[MoEBlock] = [layer.moe for layer in ours.layers]
    for layer, moe in zip(ours.layers, sparse):
        if feature == "sinks":
            layer.sinks = None
        elif feature == "o_bias":
            layer.o_bias = None
        elif feature == "expert_bias":
            moe.gate_up_bias = moe.down_bias = None
        elif feature == "router_bias":
            moe.router_bias = None
        elif feature == "routing":  # a softmax over all experts, not renormalised over the top k
            moe.routing, moe.norm_topk = "softmax_topk", False
        elif feature == "clamp":
            moe.swiglu_limit = 1e9
        elif feature == "window":
            layer.window = None
    if feature == "yarn":
        ours.config.rope_scaling = None
    assert _far(ours, ids, expected)


def test_interleaved_gate_up_split(tiny):
    """HF's gate_up_proj (E, hidden, 2I) interleaves gate and up column by column: expert 0's [gate | up]
    rows are its even columns, then its odd ones."""
    folder, model, theirs = tiny
    stacked = theirs.model.layers[0].mlp.experts.gate_up_proj[0].detach()
    fused = model.layers[0].moe.gate_up[0]
    assert torch.equal(fused[:32], stacked[:, 0::2].T) and torch.equal(fused[32:], stacked[:, 1::2].T)


# ---------------------------------------------------------------- attention sinks, kernel by kernel

def _paged_inputs(seed: int, lens: list[int], q_lens: list[int], Hq: int = 4, Hkv: int = 2, D: int = 64, ps: int = 16):
    g = torch.Generator().manual_seed(seed)
    pages_per = [-(-n // ps) for n in lens]
    P = sum(pages_per) + 1
    k_pool, v_pool = torch.randn(P, ps, Hkv, D, generator=g), torch.randn(P, ps, Hkv, D, generator=g)
    table = torch.zeros(len(lens), max(pages_per), dtype=torch.int32)
    perm = torch.randperm(P, generator=g).tolist()  # scattered pages
    i = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = torch.tensor(perm[i:i + n])
        i += n
    cu = torch.tensor([0] + np.cumsum(q_lens).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), Hq, D, generator=g)
    sinks = torch.randn(Hq, generator=g) * 2
    return q, k_pool, v_pool, table, cu, torch.tensor(lens, dtype=torch.int32), sinks


def _eager(q, k_pool, v_pool, table, cu, lens, scale, sinks, window=None):
    """Each row written out as HF's eager attention computes it: scores, causal (and window) mask, the
    sink logit appended to the softmax, its column dropped."""
    ps, Hkv = k_pool.shape[1], k_pool.shape[2]
    out = torch.empty_like(q)
    for b in range(len(lens)):
        n, ql = int(lens[b]), int(cu[b + 1] - cu[b])
        K = k_pool[table[b].long()].reshape(-1, Hkv, q.shape[2])[:n]
        V = v_pool[table[b].long()].reshape(-1, Hkv, q.shape[2])[:n]
        G = q.shape[1] // Hkv
        K, V = K.repeat_interleave(G, dim=1), V.repeat_interleave(G, dim=1)
        for i in range(ql):
            pos = n - ql + i
            s = torch.einsum("hd,nhd->hn", q[cu[b] + i], K) * scale
            keep = torch.arange(n) <= pos
            if window is not None:
                keep &= torch.arange(n) > pos - window
            s = s.masked_fill(~keep, float("-inf"))
            p = torch.cat([s, sinks[:, None]], dim=1).softmax(-1)[:, :-1]
            out[cu[b] + i] = torch.einsum("hn,nhd->hd", p, V)
    return out


@pytest.mark.parametrize("window", [None, 20])
def test_reference_attention_sinks(window):
    """The torch reference with sinks: decode rows, short (folded) chunks and a long prefill chunk in one
    step, each row as HF's eager attention computes it; without sinks it differs."""
    q, k, v, table, cu, lens, sinks = _paged_inputs(0, lens=[37, 50, 90], q_lens=[1, 5, 40])
    from kernels import reference_attention

    got = reference_attention.paged_attention(q, k, v, table, cu, lens, 0.125, window=window, sinks=sinks)
    want = _eager(q, k, v, table, cu, lens, 0.125, sinks, window)
    assert (got - want).abs().max().item() < 1e-5
    plain = reference_attention.paged_attention(q, k, v, table, cu, lens, 0.125, window=window)
    assert (plain - want).abs().max().item() > 1e-2


def test_reference_attention_runs_in_and_out_of_inference_mode():
    """The reference reuses its gather buffers between calls; one made under inference_mode (as the generator
    runs) must not be written by a later call outside it (a test, a tool), which torch refuses."""
    q, k, v, table, cu, lens, sinks = _paged_inputs(0, lens=[37, 50, 90], q_lens=[1, 5, 40])
    from kernels import reference_attention

    with torch.inference_mode():
        inside = reference_attention.paged_attention(q, k, v, table, cu, lens, 0.125, sinks=sinks)
    outside = reference_attention.paged_attention(q, k, v, table, cu, lens, 0.125, sinks=sinks)
    assert torch.equal(inside, outside)


def test_reference_attention_refuses_misshaped_sinks():
    q, k, v, table, cu, lens, sinks = _paged_inputs(1, lens=[20], q_lens=[1])
    from kernels import reference_attention

    with pytest.raises(ValueError, match="one logit per query head"):
        reference_attention.paged_attention(q, k, v, table, cu, lens, 0.125, sinks=sinks[:2])


def test_triton_path_carries_sinks(monkeypatch):
    """Where the Triton kernels run (a CUDA tensor; here Triton's CPU interpreter), the sinks reach them: decode
    and a prefill chunk give HF's eager attention, never the sink-less softmax."""
    monkeypatch.setattr(kernels, "use_triton", lambda _t: True)
    for q_lens in ([1, 1], [7, 30]):
        q, k, v, table, cu, lens, sinks = _paged_inputs(2, lens=[20, 45], q_lens=q_lens)
        want = _eager(q, k, v, table, cu, lens, 0.125, sinks)
        got = kernels.paged_attention(q, k, v, table, cu, lens, 0.125, sinks=sinks)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert (kernels.paged_attention(q, k, v, table, cu, lens, 0.125) - want).abs().max() > 1e-2


# ---------------------------------------------------------------- GGUF (llama.cpp's layout)

def _roundtrip(m: torch.Tensor, qtype: str | None) -> torch.Tensor:
    """A matrix as a GGUF of ggml type qtype holds it (rows quantized in blocks of 32 along their length)."""
    import gguf

    if qtype is None:
        return m
    q = gguf.GGMLQuantizationType[qtype]
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(m.float().numpy(), q), q)).reshape(m.shape)


def write_gpt_oss_gguf(folder: Path, out: Path, qtype="F32", tokenizer: bool = True) -> Path:
    """The GGUF llama.cpp's convert_hf_to_gguf.py writes for a gpt-oss folder: its tensor names (attn_sinks,
    post_attention_norm as the MLP's input norm, the router's bias in ffn_gate_inp.bias), gate_up_proj split
    into ffn_gate_exps and ffn_up_exps (even and odd columns) and every expert stack transposed to
    (experts, rows, cols), the biases stacked beside them; yarn scaling in rope.scaling.* keys. Matrices
    (2-D, and the expert stacks expert by expert) in qtype: F32, F16, Q8_0 or MXFP4, or a function of the GGUF name
    giving one; the default model's vocabulary unless `tokenizer` is False."""
    import gguf
    from safetensors.torch import load_file

    from tools.models.synthetic_gguf import copy_default_tokenizer

    cfg = json.loads((folder / "config.json").read_text())
    state = load_file(folder / "model.safetensors")
    rope = cfg["rope_parameters"]
    w = gguf.GGUFWriter(out, "gpt-oss")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if tokenizer:
        copy_default_tokenizer(w)
    def matrix(name: str, t: torch.Tensor) -> None:  # 2-D, or a 3-D stack quantized expert by expert
        t = t.float().contiguous()
        quant = gguf.GGMLQuantizationType[qtype(name) if callable(qtype) else qtype]
        if quant == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, t.numpy())
        elif quant == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, t.half().numpy())
        else:
            w.add_tensor(name, gguf.quants.quantize(t.numpy(), quant), raw_dtype=quant)

    names = {"input_layernorm.weight": "attn_norm.weight",
             "post_attention_layernorm.weight": "post_attention_norm.weight",
             "self_attn.sinks": "attn_sinks.weight", "mlp.router.weight": "ffn_gate_inp.weight",
             "mlp.router.bias": "ffn_gate_inp.bias"}
    for x, y in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")):
        names[f"self_attn.{x}_proj.weight"], names[f"self_attn.{x}_proj.bias"] = f"attn_{y}.weight", f"attn_{y}.bias"
    for name, t in state.items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            matrix("token_embd.weight" if name.startswith("model.") else "output.weight", t)
        elif name == "model.norm.weight":
            w.add_tensor("output_norm.weight", t.float().numpy())
        else:
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            b = f"blk.{i}."
            if rest == "mlp.experts.gate_up_proj":  # (E, hidden, 2I) -> (E, 2I, hidden), gate even, up odd
                t = t.transpose(1, 2)
                matrix(b + "ffn_gate_exps.weight", t[:, 0::2])
                matrix(b + "ffn_up_exps.weight", t[:, 1::2])
            elif rest == "mlp.experts.gate_up_proj_bias":
                w.add_tensor(b + "ffn_gate_exps.bias", t[:, 0::2].contiguous().numpy())
                w.add_tensor(b + "ffn_up_exps.bias", t[:, 1::2].contiguous().numpy())
            elif rest == "mlp.experts.down_proj":
                matrix(b + "ffn_down_exps.weight", t.transpose(1, 2))
            elif rest == "mlp.experts.down_proj_bias":
                w.add_tensor(b + "ffn_down_exps.bias", t.numpy())
            elif t.dim() == 2:
                matrix(b + names[rest], t)
            else:
                w.add_tensor(b + names[rest], t.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# GGUF variants: (the type of every 2-D matrix but the experts, the experts' type); None: F32
QUANTS = {"F32": (None, None), "Q8_0": ("Q8_0", "Q8_0"), "MXFP4-experts": (None, "MXFP4")}


def _qtype_of(variant: str):
    matrices, experts = QUANTS[variant]
    return lambda name: (experts if "_exps" in name else matrices) or "F32"


def _as_source(folder: Path, out: Path, variant: str) -> Path:
    """The HF folder of the weights a GGUF variant of `folder` holds (each matrix through its ggml type and
    back, expert by expert, in the GGUF's orientation), for transformers to run."""
    from transformers import AutoModelForCausalLM

    matrices, experts = QUANTS[variant]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                p.copy_(torch.stack([_roundtrip(e.T, experts).T for e in p]))
            elif p.dim() == 2 and not name.endswith("_bias"):  # the experts' biases are stacked, not matrices
                p.copy_(_roundtrip(p, matrices))
    model.save_pretrained(out, safe_serialization=True)
    default_tokenizer().save(out)
    return out


@pytest.mark.parametrize("variant", list(QUANTS))
def test_gguf_matches_transformers(tmp_path, variant):
    """A gpt-oss GGUF in llama.cpp's layout gives transformers' logits and greedy tokens, for the weights
    the file holds. llama.cpp rounds YaRN's ramp ends to whole dims (truncate) and fixes the SwiGLU clamp at
    7 (gpt-oss's own), so the source folder says truncate=True and limit 7 here; which layers slide comes
    from llama.cpp's rule for gpt-oss (every other layer, from the first), not from the file."""
    folder = write_gpt_oss(tmp_path / "hf", seed=5, rope_parameters={**YARN, "truncate": True}, swiglu_limit=7.0)
    path = write_gpt_oss_gguf(folder, tmp_path / "m.gguf", _qtype_of(variant))
    source = folder if variant == "F32" else _as_source(folder, tmp_path / "hf-rounded", variant)
    ours, theirs = Model.load(path, device="cpu", dtype=torch.float32, weights="dense"), hf_model(source)
    c = ours.config
    assert c.arch == "gpt-oss" and c.attention_sinks and c.output_bias and c.router_bias and c.expert_bias
    assert c.layer_types == ["sliding_attention", "full_attention"] * 2 and not c.sandwich_norm
    assert c.rope_scaling["truncate"] is True and c.rope_attention_factor == pytest.approx(0.1 * np.log(8.0) + 1)
    assert_matches_transformers(ours, theirs, prompt_ids(40, seed=6))
    assert estimate_memory(path, weights="dense").weights_bytes == ours.memory_bytes()  # sinks and biases too


@pytest.mark.parametrize("experts", ["Q8_0", "MXFP4"])
def test_gguf_experts_load_packed(tmp_path, experts, monkeypatch):
    """weights="packed": every expert (Q8_0, or MXFP4 as real files hold them; the rest F32) stays one packed
    matrix, run by the MoE kernel with the torch path's bits; prompt rows (dense weights, as repack's rule gives them) follow the dense load; decode rows (int8
    activations) give each sparse block's output within 3 % of the dense block's (measured 1.0-1.4 %) and
    the dense model's top token at most positions (test_moe_packed's bound: a near-tie of two router logits
    may flip a row's experts, which moves the rest of a random tiny model's logits; 0.83-0.92 measured)."""
    from engine.model import moe_kernel
    from engine.model.qlinear import PackedLinear
    from tests.engine.test_qlinear import decode_logits

    folder = write_gpt_oss(tmp_path / "hf", seed=7, rope_parameters={**YARN, "truncate": True}, swiglu_limit=7.0)
    path = write_gpt_oss_gguf(folder, tmp_path / "m.gguf", lambda name: experts if "_exps" in name else "F32")
    dense = Model.load(path, device="cpu", dtype=torch.float32, weights="dense")
    packed = Model.load(path, device="cpu", dtype=torch.float32, weights="packed")
    assert all(isinstance(w, PackedLinear) for layer in packed.layers for w in layer.moe.gate_up + layer.moe.down)
    assert estimate_memory(path, weights="packed").weights_bytes == packed.memory_bytes()
    ids = prompt_ids(24, seed=8)
    # over pools of the dense model's element type (a packed model's own are fp16: engine.cache.budget.pool_dtype)
    monkeypatch.setattr(packed, "kv_pool_dtype", lambda: torch.float32)
    torch.testing.assert_close(forward_tokens(packed, ids), forward_tokens(dense, ids), rtol=1e-4, atol=2e-4)
    monkeypatch.undo()
    h = torch.randn(8, dense.config.hidden_size, generator=torch.Generator().manual_seed(9))
    for d_layer, p_layer in zip(dense.layers, packed.layers):
        want, got = d_layer.moe(h), p_layer.moe(h)
        assert ((got - want).norm() / want.norm()).item() < 0.03
        # the packed experts (biases, clamped SwiGLU) run in the MoE kernel, with the torch path's bits
        assert moe_kernel.runs(p_layer.moe, h, None)
        with moe_kernel.torch_path():
            assert torch.equal(p_layer.moe(h), got)
    a, b = decode_logits(dense, ids), decode_logits(packed, ids)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.75


def test_mxfp4_gate_and_up_are_written_once_into_each_experts_matrix(tmp_path, monkeypatch):
    """An MXFP4 file's gate and up expert stacks go straight into each expert's [gate | up] (one copy from the
    file): the same bytes, flags and logits as packing each stack and stacking the parts."""
    from engine.model import moe
    from engine.model.packing import experts

    folder = write_gpt_oss(tmp_path / "hf", seed=7, rope_parameters={**YARN, "truncate": True}, swiglu_limit=7.0)
    path = write_gpt_oss_gguf(folder, tmp_path / "m.gguf", lambda name: "MXFP4" if "_exps" in name else "F32")
    written = []
    pack = experts.pack_gate_up
    monkeypatch.setattr(experts, "pack_gate_up", lambda *a, **k: written.append(pack(*a, **k)) or written[-1])
    direct = Model.load(path, device="cpu", dtype=torch.float32, weights="packed")
    assert len(written) == direct.config.num_layers and all(w is not None for w in written)
    monkeypatch.setattr(moe, "gguf_gate_up_pairs", lambda names, config: {})
    stacked = Model.load(path, device="cpu", dtype=torch.float32, weights="packed")
    for a, b in zip(direct.layers, stacked.layers):
        for x, y in zip(a.moe.gate_up, b.moe.gate_up):
            assert type(x) is type(y) and x.shape == y.shape and x.jit_dense == y.jit_dense
            assert torch.equal(x.qs, y.qs)
    assert direct.memory_bytes() == stacked.memory_bytes() == estimate_memory(path, weights="packed").weights_bytes
    ids = prompt_ids(24, seed=8)
    assert torch.equal(forward_tokens(direct, ids), forward_tokens(stacked, ids))


@pytest.mark.parametrize("seqs,Hq,Hkv,D,ps", [
    ([(1, 1), (1, 37), (1, 300), (1, 1200)], 8, 2, 64, 16),  # decode; long contexts split into merged slices
    ([(5, 40), (1, 17), (3, 290), (16, 16)], 8, 2, 32, 16),  # D % 64 != 0 (the generic path); verification rows
    ([(1, 33), (40, 600), (1, 70)], 6, 2, 64, 16),  # a long prefill chunk beside: the reference's SDPA, sinks too
])
def test_cpu_fused_attention_sinks(seqs, Hq, Hkv, D, ps):
    """The C++ kernel (kernels/cpu/attention.cpp) with sinks: each head's sink logit in its softmax
    denominator, equal to the torch reference's on the same pools; without sinks it differs."""
    from kernels import cpu_ext
    from tests.kernels.test_cpu_kernels import fused_vs_reference

    if not cpu_ext.available():
        pytest.skip("pagedeck's CPU kernels did not build here")
    sinks = torch.randn(Hq, generator=torch.Generator().manual_seed(11)) * 2
    out, expected, *_ = fused_vs_reference(seqs, Hq, Hkv, D, ps, len(seqs) + Hq, sinks=sinks)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    plain, *_ = fused_vs_reference(seqs, Hq, Hkv, D, ps, len(seqs) + Hq)
    assert (out - plain).abs().max().item() > 1e-2


def test_cpu_fused_attention_refuses_misshaped_sinks():
    from kernels import cpu_ext
    from tests.kernels.test_oracle import PagedCase

    if not cpu_ext.available():
        pytest.skip("pagedeck's CPU kernels did not build here")
    seqs, Hq, Hkv, D, ps = [(1, 20)], 4, 2, 64, 16
    case = PagedCase(seqs, Hq, Hkv, D, ps)
    qkv = torch.randn(1, (Hq + 2 * Hkv) * D)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    plan = kernels.plan_step(torch.tensor([19]), inv_freq, case.block_table, case.cu_q, case.kv, ps, fuse=True)
    with pytest.raises(RuntimeError, match="one logit per query head"):
        kernels.fused_attention(qkv, case.k_cache, case.v_cache, case.slots(0, 19, 20, ps), case.block_table, case.cu_q,
                                case.kv, Hq, D ** -0.5, plan, torch.zeros(Hq - 1))


# ---------------------------------------------------------------- llama.cpp on the same files

def test_gguf_gives_llama_cpps_logits(tmp_path):
    """llama.cpp (the peers extra) on the same tiny gpt-oss GGUFs, teacher-forced over 70 tokens (past the
    sliding window). F32: KL(llama.cpp || pagedeck) measured 3.9e-4 nats mean, 1.8e-2 at the worst position,
    the top token the same but at a near-tie; with YaRN's factor at 1 the same file gives 2.3e-5 (the suite's exact bound),
    so the rest is how the two compute YaRN's scaled rotation and llama.cpp's F16 K/V cache under the
    sharper attention it makes. The bounds sit 5x above; a wrong YaRN detail (the ramp not rounded to whole
    dims, as HF's gpt-oss config says) costs 1.3 nats, no attention factor 0.95. MXFP4 experts (as real files
    hold them, the rest F16) in both weight formats: as test_moe_packed measures llama.cpp's MoE files."""
    pytest.importorskip("llama_cpp")
    from tests.engine.test_fidelity_llamacpp import BOUNDS
    from tests.llamacpp_fidelity import kl, pagedeck_logits, sequence
    from tests.oracles.llamacpp_peer import run_jobs

    folder = write_gpt_oss(tmp_path / "hf", seed=5, rope_parameters={**YARN, "truncate": True}, swiglu_limit=7.0)
    f32 = write_gpt_oss_gguf(folder, tmp_path / "f32.gguf", "F32")
    mx = write_gpt_oss_gguf(folder, tmp_path / "mx.gguf", lambda name: "MXFP4" if "_exps" in name else "F16")
    ids = sequence(default_tokenizer().vocab_size)
    jobs = [{"op": "logits", "model": str(p), "ids": ids, "out": str(p.with_suffix(".npy"))} for p in (f32, mx)]
    assert all(r["ok"] for r in run_jobs(jobs, tmp_path)), "llama.cpp failed on a gpt-oss file"
    theirs = {p: torch.from_numpy(np.load(p.with_suffix(".npy"))) for p in (f32, mx)}
    ours = pagedeck_logits(f32, ids, "dense")
    d = kl(theirs[f32], ours)
    assert d.mean().item() < 2e-3 and d.max().item() < 0.1, (d.mean().item(), d.max().item())
    assert (theirs[f32].argmax(-1) == ours.argmax(-1)).float().mean().item() >= BOUNDS["exact"][3]
    # MXFP4 experts, test_moe_packed's measures for llama.cpp's MoE files: llama.cpp rounds the activations
    # (Q8 blocks) and so flips a near-tied router choice now and then, which the suite's dense bound does not
    # allow for; the file's weights must still be far nearer llama.cpp than the F16 source's are
    source = kl(theirs[mx], ours).mean().item()  # `ours`: the F32 source's logits
    exact = kl(theirs[mx], pagedeck_logits(mx, ids, "dense")).mean().item()
    packed = kl(theirs[mx], pagedeck_logits(mx, ids, "packed")).mean().item()
    assert exact < 0.2 and packed < 0.2 and packed < 1.5 * exact + 0.02 and exact < 0.1 * source, (exact, packed, source)


def test_mxfp4_hf_folder_is_refused_by_name(tmp_path):
    """The published gpt-oss folders store the experts as MXFP4 blocks and scales (gate_up_proj_blocks ...):
    refused at load with a message naming the tensor and what to load instead."""
    from safetensors.torch import load_file, save_file

    folder = write_gpt_oss(tmp_path / "hf", seed=1)
    state = load_file(folder / "model.safetensors")
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        w = state.pop(name)
        state[name + "_blocks"] = torch.zeros(w.shape[0], w.shape[2], w.shape[1] // 32, 16, dtype=torch.uint8)
        state[name + "_scales"] = torch.zeros(w.shape[0], w.shape[2], w.shape[1] // 32, dtype=torch.uint8)
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"^model\.layers\.0\.mlp\.experts\.\w+_blocks: gpt-oss experts stored as MXFP4"):
        Model.load(folder, device="cpu", dtype=torch.float32)

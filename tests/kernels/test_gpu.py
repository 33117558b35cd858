"""Triton kernels on a real GPU (skipped without CUDA): realistic shapes against the torch reference on the
same device, a pool past 2**31 elements (int64 addressing), and CUDA-graph capture of a decode step."""

from __future__ import annotations

import pytest
import torch

from kernels import reference_attention as ref_attention
from kernels import reference as ref
from tests.kernels.test_oracle import PagedCase

pytestmark = pytest.mark.gpu
cuda = torch.device("cuda")


def _triton_ops():
    from kernels import triton_ops

    return triton_ops


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ps", [16, 256])
@pytest.mark.parametrize("quant", [None, "q8", "q6", "q4"])
def test_attention_matches_reference_on_gpu(dtype, ps, quant):
    seqs_decode = [(1, n) for n in (1, 100, 1000, 4097, 300, 2049, 17, 64)]
    seqs_mixed = [(1, 700), (5, 900), (512, 512), (300, 1500), (1, 3)]
    for seqs in (seqs_decode, seqs_mixed):
        case = PagedCase(seqs, 32, 8, 128, ps, dtype=dtype, quant=quant, seed=ps, device=cuda)
        got = _triton_ops().paged_attention(*case.args())
        want = ref_attention.paged_attention(*case.args())
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=1e-2)
        assert not got.isnan().any()


def test_pool_beyond_int32_elements():
    """K/V pool of > 2**31 elements: page offsets must be computed in int64."""
    ps, Hkv, D = 256, 8, 128
    num_pages = (2**31) // (ps * Hkv * D) + 64
    k_cache = torch.zeros(num_pages, ps, Hkv, D, dtype=torch.float16, device=cuda)
    v_cache = torch.zeros_like(k_cache)
    top = torch.arange(num_pages - 8, num_pages, dtype=torch.int32, device=cuda).flip(0)
    block_table = top.view(2, 4)
    kv_lens = torch.tensor([1000, 777], dtype=torch.int32, device=cuda)
    for b in range(2):
        pos = torch.arange(int(kv_lens[b]), device=cuda)
        slots = block_table[b, pos // ps].long() * ps + pos % ps
        k = torch.randn(len(pos), Hkv, D, dtype=torch.float16, device=cuda)
        _triton_ops().write_kv(k, torch.randn_like(k), k_cache, v_cache, slots)
        torch.testing.assert_close(k_cache.view(-1, Hkv, D)[slots], k)
    q = torch.randn(2, 32, D, dtype=torch.float16, device=cuda)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32, device=cuda)
    got = _triton_ops().paged_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, D ** -0.5)
    want = ref_attention.paged_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, D ** -0.5)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)


def test_decode_step_captures_in_cuda_graph():
    """No host syncs in write_kv + paged_attention: capture once, replay with new lengths and tokens."""
    ops = _triton_ops()
    B, Hq, Hkv, D, ps, P = 4, 32, 8, 128, 16, 64
    k_cache = torch.randn(B * P, ps, Hkv, D, dtype=torch.float16, device=cuda)
    v_cache = torch.randn_like(k_cache)
    block_table = torch.randperm(B * P, device=cuda).to(torch.int32).view(B, P)
    kv_lens = torch.tensor([5, 100, 700, 1000], dtype=torch.int32, device=cuda)
    cu_q = torch.arange(B + 1, dtype=torch.int32, device=cuda)
    q = torch.randn(B, Hq, D, dtype=torch.float16, device=cuda)
    k = torch.randn(B, Hkv, D, dtype=torch.float16, device=cuda)
    v = torch.randn_like(k)
    slots = torch.zeros(B, dtype=torch.int64, device=cuda)

    def step():
        pos = (kv_lens - 1).long()
        slots.copy_(block_table.gather(1, (pos // ps)[:, None])[:, 0].long() * ps + pos % ps)
        ops.write_kv(k, v, k_cache, v_cache, slots)
        return ops.paged_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, D ** -0.5)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile / warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    kv_lens.copy_(torch.tensor([9, 333, 1024, 17], dtype=torch.int32))
    q.normal_()
    k.normal_()
    graph.replay()
    torch.cuda.synchronize()
    want = ref_attention.paged_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, D ** -0.5)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pointwise_on_gpu(dtype):
    ops = _triton_ops()
    x = torch.randn(300, 4096, dtype=dtype, device=cuda)
    r = torch.randn_like(x)
    w = torch.randn(4096, dtype=dtype, device=cuda)
    got, got_res = ops.rms_norm(x, w, 1e-5, r)
    want, want_res = ref.rms_norm(x, w, 1e-5, r)
    torch.testing.assert_close(got_res, want_res)
    torch.testing.assert_close(got, want, atol=3e-2, rtol=2e-2)
    gu = torch.randn(300, 2 * 14336, dtype=dtype, device=cuda)
    torch.testing.assert_close(ops.silu_mul(gu), ref.silu_mul(gu), atol=3e-2, rtol=2e-2)
    q, k = torch.randn(300, 32, 128, dtype=dtype, device=cuda), torch.randn(300, 8, 128, dtype=dtype, device=cuda)
    q2, k2 = q.clone(), k.clone()
    pos = torch.randint(0, 100000, (300,), device=cuda)
    inv_freq = 1.0 / (500000 ** (torch.arange(0, 128, 2, device=cuda).float() / 128))
    ops.apply_rotary(q, k, pos, inv_freq)
    ref.apply_rotary(q2, k2, pos, inv_freq)
    torch.testing.assert_close(q, q2, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(k, k2, atol=3e-2, rtol=2e-2)


# ---------------------------------------------------------------- dequant-matmul and LoRA kernels on the GPU

DEQUANT_TYPES = [8, 2, 3, 12, 13, 14]  # Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K


@pytest.mark.parametrize("qtype", DEQUANT_TYPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dequant_matmul_on_gpu(qtype, dtype):
    """The decode GEMV (<= 16 rows) and the prefill GEMM at a Llama-sized K, against the file's exact decode
    (the gguf package's, on the CPU) times the same activations in float64."""
    import kernels
    from tools.ggml_writers import quantize as quantize_ggml

    n, k = 1000, 4096  # n: not a multiple of any block size
    g = torch.Generator().manual_seed(qtype)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)
    raw = torch.from_numpy(quantize_ggml(w, qtype)).reshape(n, -1).contiguous()
    dense = ref.dequant_matmul_reference(torch.eye(k), raw, qtype, (n, k)).T.double()  # (n, k) decoded
    raw_gpu = raw.to(cuda)
    for m in (1, 3, 16, 17, 64):
        x = torch.randn(m, k, generator=g).to(dtype)
        got = kernels.dequant_matmul(x.to(cuda), raw_gpu, qtype, (n, k))  # the Triton kernels on CUDA
        want = x.double() @ dense.T
        assert got.shape == (m, n) and not got.isnan().any()
        err = (got.double().cpu() - want).norm() / want.norm()
        assert err < 1e-2, f"type {qtype}, {m} rows: relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_lora_kernels_on_gpu(dtype):
    import kernels
    from kernels import reference_lora
    from tests.kernels.test_lora_kernels import layout, oracle

    seg_rows = [3, 1, 40, 0, 2]
    x, a, b, col_scale = layout(5, seg_rows, ranks=[8, 16, 32])
    want = oracle(x, a, b, col_scale, seg_rows)
    x, a, b = (t.to(dtype).to(cuda) for t in (x, a, b))
    plan = kernels.lora_plan(col_scale, seg_rows, device=cuda)
    s = _triton_ops().lora_shrink(x, a, plan)
    torch.testing.assert_close(s.float(), reference_lora.lora_shrink(x.float(), a.float(), plan), atol=2e-2,
                               rtol=2e-2)
    y = torch.zeros(x.shape[0], b.shape[1], dtype=dtype, device=cuda)
    _triton_ops().lora_expand(s, b, y, plan)
    err = (y.double().cpu() - want).norm() / want.norm()
    assert err < 1e-2, f"relative error {err:.2e}"


# ---------------------------------------------------------------- the whole engine on the GPU

def _tiny_engine(device: torch.device, dtype: torch.dtype):
    """A 2-layer random Llama (weights drawn on the CPU, so every device gets the same ones) with a placeholder
    vocabulary (the generator needs a tokenizer; the default model's file is not needed)."""
    from engine import Model
    from engine.bench.synthetic import placeholder_tokenizer
    from engine.model.config import ModelConfig
    from engine.model.tensor_names import tensor_shapes

    config = ModelConfig.from_hf({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2})
    g = torch.Generator().manual_seed(7)
    weights = {name: (torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=g) * 0.08)
               for name, shape in tensor_shapes(config).items()}
    model = Model.from_state_dict(config, {k: v.to(dtype).to(device) for k, v in weights.items()}, device, dtype)
    return model, placeholder_tokenizer(512)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_engine_on_gpu_matches_cpu_forward(dtype):
    """Prefill logits on the GPU (Triton attention, pointwise kernels) against the CPU fp32 path, and four
    greedy jobs generated together on the GPU (paged decode, chunked prefill): each token is a top choice of
    the CPU one-pass forward over the same tokens."""
    gpu_model, tok = _tiny_engine(cuda, dtype)
    cpu_model, _ = _tiny_engine(torch.device("cpu"), torch.float32)
    _check_engine(gpu_model, cpu_model, tok, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_moe_engine_on_gpu_matches_cpu_forward(tmp_path, arch, dtype):
    """Mixture-of-experts models loaded from their HF folders onto the GPU, as _check_engine: Qwen3-MoE (a dense
    layer among sparse ones) and gpt-oss (attention sinks in the Triton kernels, sliding and full layers,
    biased router and experts, clamped SwiGLU). fp16, not bf16: these tiny models' wide weights turn bf16's
    rounding into logits 10-20 % off the fp32 forward on any device (the dense test covers bf16)."""
    from engine import Model
    from engine.bench.synthetic import placeholder_tokenizer

    if arch == "gpt-oss":
        from tests.engine.test_gpt_oss import write_gpt_oss

        folder = write_gpt_oss(tmp_path / arch, tokenizer=False, vocab_size=512)
    else:
        from tests.tiny_models import write_tiny_model

        folder = write_tiny_model(tmp_path / arch, arch, tie=False, tokenizer=False, vocab_size=512)
    gpu_model = Model.load(folder, device=cuda, dtype=dtype)
    cpu_model = Model.load(folder, device="cpu", dtype=torch.float32)
    assert any(layer.moe is not None for layer in gpu_model.layers)
    _check_engine(gpu_model, cpu_model, placeholder_tokenizer(512), dtype)


@pytest.mark.parametrize("kind", ["llama-q4_k_m", "gpt-oss-mxfp4"])
def test_gguf_on_gpu_matches_cpu_forward(tmp_path, kind):
    """GGUF files on the GPU (their blocks decoded to dense weights while loading), as _check_engine: a Llama
    in llama.cpp's Q4_K_M mix (Q4_K and Q6_K matrices, rows of whole super-blocks) in bf16 and gpt-oss with
    MXFP4 experts in fp32 (with the GGUF's clamp at 7 its tiny model's half-precision logits wander from
    fp32's on the CPU's own path too), each against the same file's CPU fp32 forward."""
    from engine import Model
    from engine.bench.synthetic import placeholder_tokenizer
    from tests.tiny_models import WIDE, q4_k_m, write_tiny_gguf, write_tiny_model

    if kind == "gpt-oss-mxfp4":
        from tests.engine.test_gpt_oss import write_gpt_oss, write_gpt_oss_gguf

        hf = write_gpt_oss(tmp_path / "hf", tokenizer=False, vocab_size=512)
        path = write_gpt_oss_gguf(hf, tmp_path / "m.gguf", lambda n: "MXFP4" if "_exps" in n else "Q8_0",
                                  tokenizer=False)
    else:
        hf = write_tiny_model(tmp_path / "hf", "llama", tie=False, tokenizer=False, vocab_size=512, weight_std=0.125,
                              **WIDE)
        path = write_tiny_gguf(hf, tmp_path / "m.gguf", q4_k_m, tokenizer=False)
    dtype = torch.float32 if kind.startswith("gpt-oss") else torch.bfloat16
    gpu_model = Model.load(path, device=cuda, dtype=dtype, weights="dense")
    cpu_model = Model.load(path, device="cpu", dtype=torch.float32, weights="dense")
    _check_engine(gpu_model, cpu_model, placeholder_tokenizer(512), dtype)


def _check_engine(gpu_model, cpu_model, tok, dtype):
    from engine import DynamicGenerator, DynamicJob, PagedCache, SamplerSettings
    from tests.engine.pagetable_checks import check_released
    from tools.logits import forward_tokens

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 512, (1, n), generator=g) for n in (5, 70, 300, 33)]
    a, b = forward_tokens(gpu_model, prompts[2]).float().cpu(), forward_tokens(cpu_model, prompts[2])
    tol = 2e-2 if dtype == torch.float32 else 6e-2  # half precision: gpt-oss's fp16 forward on the CPU is 0.028 off
    assert ((a - b).norm() / b.norm()) < tol
    gen = DynamicGenerator(gpu_model, PagedCache(gpu_model, max_tokens=2048, page_size=16), tok, max_chunk_size=64)
    jobs = [DynamicJob(p, 24, gen_settings=SamplerSettings.greedy()) for p in prompts]
    tokens = {id(j): [] for j in jobs}
    gen.enqueue(jobs)
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                tokens[id(r["job"])] += r["token_ids"]
    # a token within this many standard deviations of the CPU's best (half precision picks among near ties;
    # gpt-oss's fp16 forward on the CPU's own torch path lands up to ~0.17 away)
    margin = {torch.float32: 0.02, torch.float16: 0.25}.get(dtype, 0.15)
    for p, j in zip(prompts, jobs):
        out = tokens[id(j)]
        assert len(out) == 24
        full = torch.cat([p, torch.tensor([out])], dim=1)
        logits = forward_tokens(cpu_model, full)[p.shape[1] - 1: -1]
        best = logits.max(-1).values
        picked = logits.gather(1, torch.tensor(out)[:, None])[:, 0]
        assert ((best - picked) <= margin * logits.std()).all(), f"off the CPU's top choice: {(best - picked).max()}"
    check_released(gen.pagetable)

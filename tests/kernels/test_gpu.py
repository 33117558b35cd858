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

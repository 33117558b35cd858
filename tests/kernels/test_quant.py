"""Quantized K/V page formats: round-trip accuracy and layout of the torch path, and the Triton
attention kernels reading q8/q6/q4 pools (CPU interpreter) against the oracle over dequantized values."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.kv_quant import QuantizedPool, dequantize, make_pool, qmax, quantize
from tests.kernels.test_oracle import PagedCase


@pytest.mark.parametrize("fmt,bits", [("q8", 8), ("q6", 6), ("q4", 4)])
def test_round_trip_error_is_half_a_step(fmt, bits):
    x = torch.randn(50, 3, 64) * torch.linspace(0.1, 10, 64)  # channels of very different scale
    data, high, scales = quantize(x, fmt)
    y = dequantize(data, high, scales, fmt, 32, torch.float32)
    step = scales.float().repeat_interleave(32, -1)
    assert ((x - y).abs() <= step * 0.5 + 1e-3 * x.abs()).all()
    rel = ((x - y).norm() / x.norm()).item()
    assert rel < {8: 0.01, 6: 0.04, 4: 0.16}[bits]
    # packed sizes: q8 1 byte/value, q6 0.75, q4 0.5, plus one fp16 scale per 32 values
    assert data.shape[-1] == {8: 64, 6: 32, 4: 32}[bits]
    assert (high is not None) == (bits == 6)
    assert x.abs().amax() <= qmax(fmt) * scales.float().amax() * 1.001


def test_q4_packing_layout_is_documented_one():
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([7.0, -7.0, 1.0, 0.0])  # scale = 1 exactly
    data, _, scales = quantize(x, "q4")
    assert scales.item() == 1.0
    assert data[0, 0].item() == (7 + 8) | ((-7 + 8) << 4)  # value 2j low nibble, 2j+1 high nibble
    assert data[0, 1].item() == (1 + 8) | ((0 + 8) << 4)


def test_pool_bytes_and_copy_pages():
    pool = make_pool("q6", 8, 16, 2, 64, torch.float16)
    assert isinstance(pool, QuantizedPool) and pool.shape == (8, 16, 2, 64)
    per_token = pool.nbytes // (pool.num_pages * pool.page_size)
    assert per_token == 2 * (32 + 16 + 2 * 2)  # per head: 32 low + 16 high + 2 scales (2 bytes)
    assert make_pool(None, 8, 16, 2, 64, torch.float16).shape == (8, 16, 2, 64)
    x = torch.randn(16, 2, 64)
    pool.write(x, torch.arange(16) + 3 * 16)
    kernels.copy_pages(pool, torch.tensor([3]), torch.tensor([5]))
    torch.testing.assert_close(pool.gather(torch.tensor([5]), torch.float32)[0], pool.gather(torch.tensor([3]), torch.float32)[0])
    with pytest.raises(ValueError, match="unknown KV quantization"):
        make_pool("q3", 8, 16, 2, 64, torch.float16)
    with pytest.raises(ValueError, match="multiple of group_size"):
        make_pool("q4", 8, 16, 2, 40, torch.float16)


def test_quantized_attention_close_to_unquantized():
    """The whole point: a q8 cache barely moves attention output, q4 moves it more, both stay close."""
    base = PagedCase([(1, 200), (7, 90)], 6, 2, 64, 16, seed=1)
    want = kernels.paged_attention(*base.args())
    errs = {}
    for fmt in ("q8", "q6", "q4"):
        case = PagedCase([(1, 200), (7, 90)], 6, 2, 64, 16, seed=1, quant=fmt)
        errs[fmt] = (kernels.paged_attention(*case.args()) - want).abs().max().item()
    assert errs["q8"] < errs["q6"] < errs["q4"] < 0.2
    assert errs["q8"] < 0.01


triton_cases = [("q8", 16, "decode"), ("q6", 256, "decode"), ("q4", 16, "decode"),
                ("q8", 256, "prefill"), ("q6", 16, "prefill"), ("q4", 256, "prefill")]


@pytest.mark.parametrize("fmt,ps,kind", triton_cases)
def test_triton_attention_reads_quantized_pools(fmt, ps, kind):
    pytest.importorskip("triton")
    from kernels.triton_decode import decode_attention
    from kernels.triton_prefill import prefill_attention

    seqs = [(1, 1), (1, ps + 21), (1, 45)] if kind == "decode" else [(1, 30), (6, ps + 21), (20, 20)]
    # kernel level: unrotated pools (the public entry's rotation is tested below); NaN scales in unwritten slots
    case = PagedCase(seqs, 6, 2, 64, ps, num_pages=16384 // ps, quant=fmt, seed=ps, rotate=False)
    out = torch.full_like(case.q, float("nan"))
    if kind == "decode":
        decode_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.kv, case.scale,
                         num_splits=2, out=out)
    else:
        prefill_attention(*case.args(), out=out)
    torch.testing.assert_close(out, case.expected(), atol=1e-5, rtol=1e-5)


def test_rotated_pools_through_triton_entry_point():
    """triton_ops.paged_attention rotates q and un-rotates the output for rotated pools, as the torch path does."""
    pytest.importorskip("triton")
    from kernels import triton_ops

    case = PagedCase([(1, 40), (5, 70)], 6, 2, 64, 16, quant="q4", seed=9)
    assert case.k_cache.rotation is not None
    torch.testing.assert_close(triton_ops.paged_attention(*case.args()), case.expected(), atol=1e-5, rtol=1e-5)


def test_rotation_spreads_outlier_channels():
    """Keys with one huge channel: rotation before quantizing cuts the q4 error several-fold."""
    x = torch.randn(64, 4, 64, generator=torch.Generator().manual_seed(0))  # seeded: not the suite's RNG state
    x[..., 5] *= 40
    err = {}
    for rotate in (False, True):
        pool = QuantizedPool.empty("q4", 4, 16, 4, 64, rotate=rotate)
        pool.write(x, torch.arange(64))
        err[rotate] = ((pool.gather(torch.arange(4), torch.float32).reshape(64, 4, 64) - x).norm() / x.norm()).item()
    assert err[True] < err[False] / 2

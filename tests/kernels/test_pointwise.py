"""Triton RMSNorm / rotary / SiLU-mul / K-V write through the CPU interpreter against the torch references
(which are themselves checked against transformers in test_oracle.py)."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.kv_quant import QuantizedPool

pytest.importorskip("triton")

from kernels import triton_kv, triton_pointwise  # noqa: E402

F32, F16 = torch.float32, torch.float16


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, with_residual):
    g = torch.Generator().manual_seed(int(with_residual))
    x = torch.randn(7, 3, 40, generator=g).to(dtype)  # 3-D like Qwen3's per-head q/k norm; N not a power of 2
    w = torch.randn(40, generator=g).to(dtype)
    res = torch.randn(7, 3, 40, generator=g).to(dtype) if with_residual else None
    out, res_out = triton_pointwise.rms_norm(x, w, 1e-6, res)
    ref_out, ref_res = ref.rms_norm(x, w, 1e-6, res)
    torch.testing.assert_close(res_out, ref_res, atol=0, rtol=0)
    # fp32 math inside; in fp16 allow the reference's own rounding (one fp16 ulp around |out| <= ~8)
    torch.testing.assert_close(out, ref_out, **({"atol": 1e-5, "rtol": 1e-5} if dtype == F32 else {"atol": 8e-3, "rtol": 2e-3}))


@pytest.mark.parametrize("dtype", [F32, F16])
def test_rotary_in_place_on_fused_qkv_views(dtype):
    T, Hq, Hkv, D = 5, 6, 2, 32
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D).to(dtype)
    q = qkv[:, : Hq * D].view(T, Hq, D)  # strided views into one projection output, as a model produces
    k = qkv[:, Hq * D: (Hq + Hkv) * D].view(T, Hkv, D)
    v_before = qkv[:, (Hq + Hkv) * D:].clone()
    q_ref, k_ref = q.clone(), k.clone()
    pos = torch.tensor([0, 1, 17, 4095, 3])
    # Llama-3 style scaled frequencies are just another inv_freq vector
    inv_freq = 1.0 / (500000 ** (torch.arange(0, D, 2).float() / D)) / torch.linspace(1, 8, D // 2)
    triton_pointwise.apply_rotary(q, k, pos, inv_freq)
    ref.apply_rotary(q_ref, k_ref, pos, inv_freq)
    tol = {"atol": 2e-5, "rtol": 1e-5} if dtype == F32 else {"atol": 4e-3, "rtol": 2e-3}
    torch.testing.assert_close(q, q_ref, **tol)
    torch.testing.assert_close(k, k_ref, **tol)
    assert torch.equal(qkv[:, (Hq + Hkv) * D:], v_before)  # v untouched


@pytest.mark.parametrize("dtype", [F32, F16])
def test_silu_mul(dtype):
    gu = (torch.randn(4, 2 * 1100) * 4).to(dtype)  # I > one block of 1024
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == F32 else {"atol": 1e-2, "rtol": 2e-3}
    torch.testing.assert_close(triton_pointwise.silu_mul(gu), ref.silu_mul(gu), **tol)


@pytest.mark.parametrize("dtype", [F32, F16])
def test_gelu_tanh_mul(dtype):
    gu = (torch.randn(4, 2 * 1100) * 4).to(dtype)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == F32 else {"atol": 1e-2, "rtol": 2e-3}
    torch.testing.assert_close(triton_pointwise.gelu_tanh_mul(gu), ref.gelu_tanh_mul(gu), **tol)


def test_rotary_attention_factor_on_partial_rotary_views():
    """LongRoPE's attention factor scales cos/sin; partial rotary passes each head's first dims as views."""
    T, H, D, R = 5, 3, 32, 16
    q, k = torch.randn(T, H, D), torch.randn(T, 1, D)
    q_ref, k_ref = q.clone(), k.clone()
    pos = torch.tensor([0, 1, 17, 4095, 3])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, R, 2).float() / R))
    triton_pointwise.apply_rotary(q[..., :R], k[..., :R], pos, inv_freq, 1.19)
    ref.apply_rotary(q_ref[..., :R], k_ref[..., :R], pos, inv_freq, attention_factor=1.19)
    torch.testing.assert_close(q, q_ref, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(k, k_ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [F32, F16])
def test_write_kv_plain(dtype):
    shape = (64, 16, 2, 32)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    k, v = torch.randn(9, 2, 32).to(dtype), torch.randn(9, 2, 32).to(dtype)
    slots = torch.randperm(64 * 16)[:9]
    triton_kv.write_kv(k, v, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache.view(-1, 2, 32)[slots], k, atol=0, rtol=0)
    torch.testing.assert_close(v_cache.view(-1, 2, 32)[slots], v, atol=0, rtol=0)
    assert k_cache.isnan().sum() == k_cache.numel() - k.numel()  # nothing else written


@pytest.mark.parametrize("fmt,rotate", [("q8", False), ("q6", True), ("q4", False)])
def test_write_kv_quantized_matches_torch_writer(fmt, rotate):
    T, H, D = 6, 2, 64
    pools = [QuantizedPool.empty(fmt, 32, 16, H, D, rotate=rotate) for _ in range(4)]
    k, v = torch.randn(T, H, D) * 3, torch.randn(T, H, D)
    k[0, 0, :] = 0  # all-zero groups: scale 0 must decode to exact zeros, not NaN
    slots = torch.randperm(32 * 16)[:T]
    triton_kv.write_kv(k, v, pools[0], pools[1], slots)
    ref.write_kv(k, v, pools[2], pools[3], slots)
    for got, want in ((pools[0], pools[2]), (pools[1], pools[3])):
        torch.testing.assert_close(got.scales, want.scales, atol=0, rtol=0)
        a = got.gather_rotated(torch.arange(32), torch.float32)
        b = want.gather_rotated(torch.arange(32), torch.float32)
        # identical arithmetic; allow one grid step where float rounding of x * (1/scale) lands on a tie
        step = got.scales.float().repeat_interleave(got.group_size, -1)
        assert ((a - b).abs() <= step * 1.0001).all()
        assert (a != b).float().mean() < 0.01
    assert torch.equal(pools[0].gather(slots // 16, torch.float32)[torch.arange(T), slots % 16][0, 0], torch.zeros(D))

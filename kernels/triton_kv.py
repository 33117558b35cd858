"""Triton side of the K/V pools: the write kernel (quantize-on-write for q8/q6/q4) and `load_kv_tile`,
the dequantize-on-read helper both attention kernels use. Page formats are defined in kv_quant.py.

Pools are addressed by flat slot (page * page_size + offset); offsets are int64 so pools larger than
2**31 elements index correctly."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kv_quant import QuantizedPool
from .reference import check_kv_write

FMT_CODE = {None: 0, "q8": 8, "q6": 6, "q4": 4}


@triton.jit
def load_kv_tile(data, high, scales, s_data, s_high, s_scale, slot, head, mask_n, d,
                 FMT: tl.constexpr, D: tl.constexpr, GS: tl.constexpr):
    """(BLOCK_N, BLOCK_D) tile of one head for a vector of slots, dequantized per FMT (plain pools come
    back in their own dtype, quantized ones in fp32); masked rows (past the sequence: unwritten slots may
    hold NaN) and padded columns read as 0. Row pointers are formed first (int64 per row, not per
    element) so the 2-D address tile stays cheap in registers."""
    mask = mask_n[:, None] & (d[None, :] < D)
    if FMT == 0:
        rows = data + (slot * s_data + head * D)
        x = tl.load(rows[:, None] + d[None, :], mask=mask, other=0.0)
    else:
        HS: tl.constexpr = D // GS
        srows = scales + (slot * s_scale + head * HS)
        sc = tl.load(srows[:, None] + (d // GS)[None, :], mask=mask, other=0.0).to(tl.float32)
        if FMT == 8:
            rows = data + (slot * s_data + head * D)
            u = tl.load(rows[:, None] + d[None, :], mask=mask, other=0).to(tl.int32)
        else:
            rows = data + (slot * s_data + head * (D // 2))
            byte = tl.load(rows[:, None] + (d // 2)[None, :], mask=mask, other=0)
            u = (byte.to(tl.int32) >> ((d[None, :] % 2) * 4)) & 15
            if FMT == 6:
                hrows = high + (slot * s_high + head * (D // 4))
                hb = tl.load(hrows[:, None] + (d // 4)[None, :], mask=mask, other=0)
                u = u | (((hb.to(tl.int32) >> ((d[None, :] % 4) * 2)) & 3) << 4)
        x = (u - (1 << (FMT - 1))).to(tl.float32) * sc
    return x


@triton.jit
def _quant_part(x, inv, QMAX: tl.constexpr):
    q = tl.floor(x * inv[:, None] + 0.5)
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    return q.to(tl.int32) + (QMAX + 1)


@triton.jit
def _write_kv_kernel(src, s_tok, s_head, slots, data, high, scales, s_data, s_high, s_scale,
                     FMT: tl.constexpr, D: tl.constexpr, GS: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_G: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slots + t).to(tl.int64)
    x_ptr = src + t.to(tl.int64) * s_tok + h * s_head
    if FMT == 0:
        d = tl.arange(0, BLOCK_D)
        x = tl.load(x_ptr + d, mask=d < D)
        tl.store(data + slot * s_data + h * D + d, x.to(data.dtype.element_ty), mask=d < D)
    else:
        # Four interleaved sub-tiles per group (values 4i+0..3): exactly what q4/q6 pack into one byte.
        QMAX: tl.constexpr = (1 << (FMT - 1)) - 1
        NG: tl.constexpr = D // GS
        g = tl.arange(0, BLOCK_G)[:, None]
        i = tl.arange(0, GS // 4)[None, :]
        m = (g < NG) & (i >= 0)
        base = g * GS + 4 * i
        x0 = tl.load(x_ptr + base, mask=m, other=0.0).to(tl.float32)
        x1 = tl.load(x_ptr + base + 1, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + base + 2, mask=m, other=0.0).to(tl.float32)
        x3 = tl.load(x_ptr + base + 3, mask=m, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.maximum(tl.max(tl.abs(x0), 1), tl.max(tl.abs(x1), 1)),
                          tl.maximum(tl.max(tl.abs(x2), 1), tl.max(tl.abs(x3), 1)))
        sc = (amax / QMAX).to(tl.float16)
        tl.store(scales + slot * s_scale + h * NG + tl.arange(0, BLOCK_G), sc, mask=tl.arange(0, BLOCK_G) < NG)
        s32 = sc.to(tl.float32)
        inv = tl.where(s32 > 0, 1.0 / tl.where(s32 > 0, s32, 1.0), 0.0)
        u0 = _quant_part(x0, inv, QMAX)
        u1 = _quant_part(x1, inv, QMAX)
        u2 = _quant_part(x2, inv, QMAX)
        u3 = _quant_part(x3, inv, QMAX)
        if FMT == 8:
            p = data + slot * s_data + h * D + base
            tl.store(p, u0.to(tl.uint8), mask=m)
            tl.store(p + 1, u1.to(tl.uint8), mask=m)
            tl.store(p + 2, u2.to(tl.uint8), mask=m)
            tl.store(p + 3, u3.to(tl.uint8), mask=m)
        else:
            p = data + slot * s_data + h * (D // 2) + base // 2
            tl.store(p, ((u0 & 15) | ((u1 & 15) << 4)).to(tl.uint8), mask=m)
            tl.store(p + 1, ((u2 & 15) | ((u3 & 15) << 4)).to(tl.uint8), mask=m)
            if FMT == 6:
                hb = (u0 >> 4) | ((u1 >> 4) << 2) | ((u2 >> 4) << 4) | ((u3 >> 4) << 6)
                tl.store(high + slot * s_high + h * (D // 4) + base // 4, hb.to(tl.uint8), mask=m)


def pool_args(pool):
    """(data, high, scales, slot strides, FMT code, group size) for a tensor pool or a QuantizedPool."""
    if isinstance(pool, QuantizedPool):
        for t in pool.tensors():
            if not t.is_contiguous():
                raise ValueError("QuantizedPool tensors must be contiguous")
        high = pool.high if pool.high is not None else pool.data
        s_high = pool.high.stride(1) if pool.high is not None else 0
        return (pool.data, high, pool.scales, pool.data.stride(1), s_high, pool.scales.stride(1),
                FMT_CODE[pool.fmt], pool.group_size)
    if not pool.is_contiguous():
        raise ValueError("K/V cache tensors must be contiguous (num_pages, page_size, Hkv, D)")
    return pool, pool, pool, pool.stride(1), 0, 0, 0, pool.shape[-1]


def _write_one(x: torch.Tensor, pool, slots: torch.Tensor) -> None:
    T, H, D = x.shape
    if isinstance(pool, QuantizedPool):
        x = pool.rotate(x)  # one small matmul; the kernel quantizes the rotated vectors
    if x.stride(-1) != 1:
        x = x.contiguous()
    data, high, scales, s_data, s_high, s_scale, fmt, gs = pool_args(pool)
    _write_kv_kernel[(T, H)](
        x, x.stride(0), x.stride(1), slots, data, high, scales, s_data, s_high, s_scale,
        FMT=fmt, D=D, GS=gs, BLOCK_D=triton.next_power_of_2(D), BLOCK_G=triton.next_power_of_2(max(D // gs, 1)),
    )


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache, v_cache, slot_mapping: torch.Tensor) -> None:
    """Triton write_kv: one program per (token, head); quantizes when the pool is a QuantizedPool."""
    check_kv_write(k, v, k_cache, v_cache, slot_mapping)
    if k.shape[0] == 0:
        return
    _write_one(k, k_cache, slot_mapping)
    _write_one(v, v_cache, slot_mapping)

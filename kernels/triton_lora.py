"""Triton shrink/expand for per-row LoRA (Punica SGMV style), checked against kernels/reference_lora.py.

Grid (segment, row block, column block): a program reads only its segment's rows and only the columns of
its segment's adapters (scale != 0), skipping blocks that hold none, so a row costs the rank of its own
adapters, not of the whole stack, and never meets another adapter's weights. Segments come from the
plan's seg_start, so no launch needs a sync.
fp32 accumulation; fp32 inputs use IEEE dots (no TF32), like the attention kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference_lora import LoRAPlan, check_lora_args

BLOCK_M = 16  # rows per program: decode segments are short (tl.dot needs >= 16)


@triton.jit
def _tile(seg_start, T, N, HAS_SEGS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's segment, its rows (int64) and columns with their masks, and whether any row is left."""
    seg = tl.program_id(0)
    if HAS_SEGS:
        r0 = tl.load(seg_start + seg)
        r1 = tl.load(seg_start + seg + 1)
    else:
        r0 = 0
        r1 = T
    first = r0 + tl.program_id(1) * BLOCK_M
    rows = first + tl.arange(0, BLOCK_M)
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    return seg, rows.to(tl.int64), rows < r1, cols, cols < N, first < r1


@triton.jit
def _shrink_kernel(x, s_x, a, s_a, out, s_o, seg_start, col_scale, s_cs, T, K, R,
                   HAS_SEGS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   IEEE: tl.constexpr):
    seg, rows64, row_ok, cols, col_ok, live = _tile(seg_start, T, R, HAS_SEGS, BLOCK_M, BLOCK_N)
    scale = tl.load(col_scale + seg * s_cs + cols, mask=col_ok, other=0.0)
    own = col_ok & (scale != 0)  # this segment's adapters' columns: the only ones read
    k_end = tl.where(live & (tl.max(own.to(tl.int32), 0) > 0), K, 0)  # else write zeros, read nothing
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        xt = tl.load(x + rows64[:, None] * s_x + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        at = tl.load(a + kk[:, None].to(tl.int64) * s_a + cols[None, :], mask=k_ok[:, None] & own[None, :],
                     other=0.0)
        if IEEE:
            acc += tl.dot(xt, at, input_precision="ieee")
        else:
            acc += tl.dot(xt, at)
    acc = acc * scale[None, :]
    tl.store(out + rows64[:, None] * s_o + cols[None, :], acc.to(out.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _expand_kernel(s, s_s, b, s_b, y, s_y, seg_start, col_scale, s_cs, col0, T, R, N,
                   HAS_SEGS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   IEEE: tl.constexpr):
    seg, rows64, row_ok, cols, col_ok, live = _tile(seg_start, T, N, HAS_SEGS, BLOCK_M, BLOCK_N)
    k_end = tl.where(live, R, 0)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < R
        scale = tl.load(col_scale + seg * s_cs + col0 + kk, mask=k_ok, other=0.0)
        own = k_ok & (scale != 0)
        if tl.max(own.to(tl.int32), 0) > 0:  # skip adapters this segment's set lacks (s is 0 there anyway)
            st = tl.load(s + rows64[:, None] * s_s + kk[None, :], mask=row_ok[:, None] & own[None, :], other=0.0)
            bt = tl.load(b + kk[:, None].to(tl.int64) * s_b + cols[None, :], mask=own[:, None] & col_ok[None, :],
                         other=0.0)
            if IEEE:
                acc += tl.dot(st, bt.to(st.dtype), input_precision="ieee")
            else:
                acc += tl.dot(st, bt.to(st.dtype))
    ptr = y + rows64[:, None] * s_y + cols[None, :]
    ok = row_ok[:, None] & col_ok[None, :]
    old = tl.load(ptr, mask=ok, other=0.0)
    tl.store(ptr, (old.to(tl.float32) + acc).to(y.dtype.element_ty), mask=ok)


def _block(n: int, lo: int = 16, hi: int = 64) -> int:
    return max(lo, min(hi, triton.next_power_of_2(max(n, 1))))


def _grid_segments(plan: LoRAPlan, T: int) -> tuple[int, int, bool]:
    if plan.seg_start is None:
        return 1, T, False
    return len(plan.seg_rows), plan.max_rows, True


def lora_shrink(x: torch.Tensor, a: torch.Tensor, plan: LoRAPlan) -> torch.Tensor:
    check_lora_args(x, a, plan)
    if x.stride(1) != 1 or a.stride(1) != 1:
        raise ValueError("lora_shrink needs x and a with a contiguous last dim")
    T, K = x.shape
    R = a.shape[1]
    out = torch.empty(T, R, dtype=x.dtype, device=x.device)
    n_seg, rows, has_segs = _grid_segments(plan, T)
    if T == 0 or R == 0 or rows == 0:
        return out.zero_()
    col_scale = plan.col_scale.float().contiguous()
    block_n = _block(R)
    grid = (n_seg, triton.cdiv(rows, BLOCK_M), triton.cdiv(R, block_n))
    _shrink_kernel[grid](x, x.stride(0), a, a.stride(0), out, out.stride(0), plan.seg_start, col_scale,
                         col_scale.stride(0), T, K, R, HAS_SEGS=has_segs, BLOCK_M=BLOCK_M, BLOCK_N=block_n,
                         BLOCK_K=_block(K, hi=64), IEEE=x.dtype == torch.float32)
    return out


def lora_expand(s: torch.Tensor, b: torch.Tensor, y: torch.Tensor, plan: LoRAPlan, col0: int = 0) -> None:
    if s.shape[0] != y.shape[0] or s.shape[1] != b.shape[0] or b.shape[1] != y.shape[1]:
        raise ValueError(f"lora_expand wants s (T, r), b (r, n), y (T, n); got {tuple(s.shape)}, "
                         f"{tuple(b.shape)}, {tuple(y.shape)}")
    if s.stride(1) != 1 or b.stride(1) != 1 or y.stride(1) != 1:
        raise ValueError("lora_expand needs s, b and y with a contiguous last dim (y may be a column slice)")
    T, R = s.shape
    N = y.shape[1]
    n_seg, rows, has_segs = _grid_segments(plan, T)
    if T == 0 or R == 0 or N == 0 or rows == 0:
        return
    col_scale = plan.col_scale.float().contiguous()
    block_n = _block(N, hi=64)
    grid = (n_seg, triton.cdiv(rows, BLOCK_M), triton.cdiv(N, block_n))
    _expand_kernel[grid](s, s.stride(0), b, b.stride(0), y, y.stride(0), plan.seg_start, col_scale,
                         col_scale.stride(0), col0, T, R, N, HAS_SEGS=has_segs, BLOCK_M=BLOCK_M,
                         BLOCK_N=block_n, BLOCK_K=_block(R, hi=32), IEEE=s.dtype == torch.float32)

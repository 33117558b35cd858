"""Dequantize-and-multiply Triton kernels reading GGUF blocks as stored (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K,
Q6_K): a decode GEMV (a few rows of activations) and a tiled GEMM (prefill), for the CUDA path.

Weights stay as the file's bytes, `raw` (N, bytes per row) uint8 on the device; each program decodes the
(BLOCK_N, BLOCK_K) tile it needs in registers (fp16 scales assembled from two bytes, nibbles and high bits
gathered per element) and never writes a dense copy. The torch reference is `dequant_matmul_reference`
(engine.weights' exact decoders, then a matmul); the tests compare the two through the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType

from .formats import ggml_block

# the GGUF types dequant_tile decodes: ggml type id -> (weights per block, bytes per block), gguf's own sizes
FORMATS = {GGMLQuantizationType[t].value: ggml_block(t) for t in ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")}


@triton.jit
def _f16(ptr, mask):
    """An fp16 stored as two little-endian bytes at byte pointers `ptr`, as fp32."""
    lo = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _byte(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _k_scale_min(s, sub, mask):
    """Q4_K/Q5_K's 6-bit (scale, min) of sub-block `sub` from the 12 scale bytes at `s`."""
    lo = sub < 4
    a = _byte(s + sub, mask & lo)
    b = _byte(s + sub + 4, mask)
    c = _byte(s + sub - 4, mask & (sub >= 4))
    sc = tl.where(lo, a & 63, (b & 0xF) | ((c >> 6) << 4))
    m_lo = b & 63
    m_hi = (b >> 4) | ((_byte(s + sub, mask & ~lo) >> 6) << 4)
    return sc.to(tl.float32), tl.where(lo, m_lo, m_hi).to(tl.float32)


@triton.jit
def dequant_tile(raw, row_bytes, n, k, mask, QTYPE: tl.constexpr):
    """Weights at rows n and columns k (broadcastable int tensors) of a GGUF matrix, as fp32."""
    if QTYPE == 8:  # Q8_0: d, 32 int8
        base = raw + n.to(tl.int64) * row_bytes + (k // 32) * 34
        q = tl.load(base + 2 + k % 32, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        w = _f16(base, mask) * q
    elif QTYPE == 2 or QTYPE == 3:  # Q4_0: d, 16 bytes of nibbles; Q4_1: d, m, nibbles
        size: tl.constexpr = 18 if QTYPE == 2 else 20
        start: tl.constexpr = 2 if QTYPE == 2 else 4
        base = raw + n.to(tl.int64) * row_bytes + (k // 32) * size
        j = k % 32
        byte = _byte(base + start + j % 16, mask)
        q = tl.where(j < 16, byte & 0xF, byte >> 4).to(tl.float32)
        if QTYPE == 2:
            w = (q - 8.0) * _f16(base, mask)
        else:
            w = q * _f16(base, mask) + _f16(base + 2, mask)
    elif QTYPE == 12 or QTYPE == 13:  # Q4_K / Q5_K: d, dmin, 12 scale bytes, (Q5_K: 32 high-bit bytes,) nibbles
        size: tl.constexpr = 144 if QTYPE == 12 else 176
        qs: tl.constexpr = 16 if QTYPE == 12 else 48
        base = raw + n.to(tl.int64) * row_bytes + (k // 256) * size
        j = k % 256
        sub = j // 32
        l = j % 32
        byte = _byte(base + qs + (j // 64) * 32 + l, mask)
        q = tl.where(sub % 2 == 0, byte & 0xF, byte >> 4)
        if QTYPE == 13:
            q = q | (((_byte(base + 16 + l, mask) >> sub) & 1) << 4)
        sc, m = _k_scale_min(base + 4, sub, mask)
        w = _f16(base, mask) * sc * q.to(tl.float32) - _f16(base + 2, mask) * m
    else:  # Q6_K: 128 low-nibble bytes, 64 high-bit bytes, 16 int8 scales, d
        base = raw + n.to(tl.int64) * row_bytes + (k // 256) * 210
        j = k % 256
        half = j // 128
        r = j % 128
        quad = r // 32
        l = r % 32
        low = _byte(base + half * 64 + l + (quad % 2) * 32, mask)
        low = tl.where(quad < 2, low & 0xF, low >> 4)
        high = (_byte(base + 128 + half * 32 + l, mask) >> (2 * quad)) & 3
        q = ((low | (high << 4)) - 32).to(tl.float32)
        sc = tl.load(base + 192 + half * 8 + l // 16 + 2 * quad, mask=mask, other=0).to(tl.int8, bitcast=True)
        w = _f16(base + 208, mask) * sc.to(tl.float32) * q
    return w


@triton.jit
def _gemv_kernel(x, s_xm, raw, row_bytes, out, s_om, N, K, QTYPE: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One activation row (program axis 1) against BLOCK_N weight rows (axis 0): sum over K of w * x."""
    pid = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mask = (n[:, None] < N) & (k[None, :] < K)
        w = dequant_tile(raw, row_bytes, n[:, None], k[None, :], mask, QTYPE)
        xv = tl.load(x + m * s_xm + k, mask=k < K, other=0.0).to(tl.float32)
        acc += tl.sum(w * xv[None, :], axis=1)
    tl.store(out + m * s_om + n, acc.to(out.dtype.element_ty), mask=n < N)


@triton.jit
def _gemm_kernel(x, s_xm, raw, row_bytes, out, s_om, M, N, K, QTYPE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    """(BLOCK_M, BLOCK_N) of x @ W.T, the weight tile decoded per K step and fed to tl.dot."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x + rm[:, None].to(tl.int64) * s_xm + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K),
                    other=0.0)
        wt = dequant_tile(raw, row_bytes, rn[None, :], k[:, None], (rn[None, :] < N) & (k[:, None] < K), QTYPE)
        if IEEE:
            acc += tl.dot(a.to(tl.float32), wt, input_precision="ieee")
        else:
            acc += tl.dot(a, wt.to(a.dtype))
    tl.store(out + rm[:, None].to(tl.int64) * s_om + rn[None, :], acc.to(out.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _check(x: torch.Tensor, raw: torch.Tensor, qtype: int, shape: tuple[int, int]) -> None:
    if qtype not in FORMATS:
        raise ValueError(f"no dequant-matmul kernel for ggml type {qtype}; supported: {sorted(FORMATS)}")
    block, size = FORMATS[qtype]
    n, k = shape
    if k % block or raw.shape != (n, k // block * size) or raw.dtype != torch.uint8:
        raise ValueError(f"raw must be uint8 ({n}, {k // block * size}) for a ({n}, {k}) matrix, got "
                         f"{tuple(raw.shape)} {raw.dtype}")
    if x.shape[-1] != k or x.stride(-1) != 1:
        raise ValueError(f"x must be (M, {k}) with a contiguous last dim, got {tuple(x.shape)}")


def dequant_gemv(x: torch.Tensor, raw: torch.Tensor, qtype: int, shape: tuple[int, int], block_n: int = 32,
                 block_k: int = 64) -> torch.Tensor:
    """x (M, K), M small (decode) -> (M, N) = x @ W.T with W read from its GGUF blocks. Tile 32 x 64 with
    8 warps: the largest that compiles without spills for every type (sm_90, compile_check); untuned."""
    _check(x, raw, qtype, shape)
    n, k = shape
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n), x.shape[0])](x, x.stride(0), raw, raw.stride(0), out, out.stride(0), n, k,
                                                         QTYPE=qtype, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=8)
    return out


def dequant_gemm(x: torch.Tensor, raw: torch.Tensor, qtype: int, shape: tuple[int, int], block_m: int = 32,
                 block_n: int = 64, block_k: int = 32) -> torch.Tensor:
    """x (M, K), M large (prefill) -> (M, N) = x @ W.T, tiled; fp32 activations use IEEE dots."""
    _check(x, raw, qtype, shape)
    n, k = shape
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(x.shape[0], block_m), triton.cdiv(n, block_n))
    _gemm_kernel[grid](x, x.stride(0), raw, raw.stride(0), out, out.stride(0), x.shape[0], n, k, QTYPE=qtype,
                       BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=x.dtype == torch.float32)
    return out

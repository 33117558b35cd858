"""Triton kernels for the per-token ops: RMSNorm (+ fused residual add), rotary from per-token
positions, SiLU- and GeLU(tanh)-and-multiply. Numerics follow kernels/reference.py (fp32 math, cast at
the end)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import _check_rotary


@triton.jit
def tanh(x):
    """tanh from exp of a non-positive argument (no overflow; Triton's core has no tanh)."""
    t = tl.exp(-2.0 * tl.abs(x))
    r = (1.0 - t) / (1.0 + t)
    return tl.where(x >= 0, r, -r)


@triton.jit
def _rms_norm_kernel(x, s_x, res, s_res, w, out, s_out, res_out, s_ro, N, eps,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    m = c < N
    v = tl.load(x + row * s_x + c, mask=m, other=0.0)
    if HAS_RES:
        v = (v.to(tl.float32) + tl.load(res + row * s_res + c, mask=m, other=0.0).to(tl.float32)).to(v.dtype)
        tl.store(res_out + row * s_ro + c, v, mask=m)
    vf = v.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(vf * vf, 0) / N + eps)
    normed = (vf * rstd).to(v.dtype)
    wv = tl.load(w + c, mask=m, other=0.0)
    tl.store(out + row * s_out + c, (wv.to(tl.float32) * normed.to(tl.float32)).to(out.dtype.element_ty), mask=m)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]) if t.stride(-1) == 1 else t.contiguous().reshape(-1, t.shape[-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """One program per row; the residual sum is written once and normalized from registers."""
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"rms_norm weight shape {tuple(weight.shape)} does not match x {tuple(x.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    N = x.shape[-1]
    x2 = _rows(x)
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    o2 = out.view(-1, N)
    if x2.shape[0] == 0:
        return out, (x if residual is None else x + residual)
    if residual is None:
        r2, ro, ro2 = x2, x, x2
    else:
        r2 = _rows(residual)
        ro = torch.empty_like(x, memory_format=torch.contiguous_format)
        ro2 = ro.view(-1, N)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, x2.stride(0), r2, r2.stride(0), weight, o2, o2.stride(0), ro2, ro2.stride(0), N, eps,
        HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(N),
    )
    return out, ro


@triton.jit
def _rotary_kernel(q, s_qt, s_qh, k, s_kt, s_kh, pos, inv_freq, HQ, factor,
                   HALF: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    j = tl.arange(0, BLOCK)
    m = j < HALF
    p = tl.load(pos + t).to(tl.float32)
    f = p * tl.load(inv_freq + j, mask=m, other=0.0).to(tl.float32)
    c = tl.cos(f) * factor
    s = tl.sin(f) * factor
    if h < HQ:
        ptr = q + t * s_qt + h * s_qh
    else:
        ptr = k + t * s_kt + (h - HQ) * s_kh
    x1 = tl.load(ptr + j, mask=m, other=0.0)
    x2 = tl.load(ptr + HALF + j, mask=m, other=0.0)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    tl.store(ptr + j, (a * c - b * s).to(x1.dtype), mask=m)
    tl.store(ptr + HALF + j, (b * c + a * s).to(x1.dtype), mask=m)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                 attention_factor: float = 1.0) -> None:
    """In place; q/k may be strided views (e.g. slices of a fused qkv projection, or each head's first
    rotary dims) with a contiguous last dim."""
    _check_rotary(q, k, positions, inv_freq)
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("apply_rotary needs q and k with a contiguous last dim (it works in place)")
    T, Hq, D = q.shape
    if T == 0:
        return
    _rotary_kernel[(T, Hq + k.shape[1])](
        q, q.stride(0), q.stride(1), k, k.stride(0), k.stride(1), positions, inv_freq, Hq, float(attention_factor),
        HALF=D // 2, BLOCK=triton.next_power_of_2(D // 2),
    )


@triton.jit
def _act_mul_kernel(gu, s_gu, out, s_out, I, GELU: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < I
    g = tl.load(gu + t * s_gu + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu + t * s_gu + I + c, mask=m, other=0.0).to(tl.float32)
    if GELU:  # tanh approximation, as torch's gelu(approximate="tanh")
        a = 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
    else:
        a = g / (1.0 + tl.exp(-g))
    tl.store(out + t * s_out + c, (a * u).to(out.dtype.element_ty), mask=m)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    return _act_mul(gate_up, gelu=False)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    return _act_mul(gate_up, gelu=True)


def _act_mul(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    if gate_up.shape[-1] % 2:
        raise ValueError(f"the gated activation wants an even last dim ([gate | up]), got {gate_up.shape[-1]}")
    I = gate_up.shape[-1] // 2
    gu = _rows(gate_up)
    out = torch.empty(*gate_up.shape[:-1], I, dtype=gate_up.dtype, device=gate_up.device)
    if gu.shape[0] == 0:
        return out
    BLOCK = min(1024, triton.next_power_of_2(I))
    _act_mul_kernel[(gu.shape[0], triton.cdiv(I, BLOCK))](gu, gu.stride(0), out, I, I, GELU=gelu, BLOCK=BLOCK)
    return out

"""Plain-torch reference implementations of the small per-token ops.

These are what the CPU engine runs, and what the Triton kernels are tested against, so they follow
Hugging Face's numerics (fp32 statistics, result cast back to the input dtype)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .kv_quant import QuantizedPool


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim; with `residual`, normalizes x + residual and returns that sum too
    (the next layer's residual stream), as Llama's pre-norm blocks need."""
    if weight.shape[-1] != x.shape[-1] or weight.dim() != 1:
        raise ValueError(f"rms_norm weight shape {tuple(weight.shape)} does not match x {tuple(x.shape)}")
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
        x = x + residual
    if x.dtype == torch.float32:  # one call instead of six: same fp32 statistics as below
        return F.rms_norm(x, weight.shape, weight, eps), x
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype), x


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor,
                  attention_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (T, D/2) in fp32 for absolute positions; computed in fp32 like HF's rotary module, which
    also multiplies both by the rope's attention factor (LongRoPE's mscale; 1 for plain RoPE)."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    if attention_factor == 1.0:
        return freqs.cos(), freqs.sin()
    return freqs.cos() * attention_factor, freqs.sin() * attention_factor


def _check_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"apply_rotary wants q (T, Hq, D) and k (T, Hkv, D), got {tuple(q.shape)}, {tuple(k.shape)}")
    T, _, D = q.shape
    if k.shape[0] != T or k.shape[2] != D:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on tokens or head_dim")
    if positions.shape != (T,):
        raise ValueError(f"positions must be ({T},), got {tuple(positions.shape)}")
    if inv_freq.shape != (D // 2,) or D % 2:
        raise ValueError(f"inv_freq must be ({D // 2},) for head_dim {D}, got {tuple(inv_freq.shape)}")


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                 tables: tuple[torch.Tensor, torch.Tensor] | None = None, attention_factor: float = 1.0) -> None:
    """In-place rotary embedding, rotate_half convention (first half pairs with second half).

    `tables` are rotary_tables(positions, inv_freq, attention_factor), computed once per forward instead
    of per layer. q/k may be views of the first rotary dims of each head (partial rotary)."""
    _check_rotary(q, k, positions, inv_freq)
    cos, sin = tables if tables is not None else rotary_tables(positions, inv_freq, attention_factor)
    c = cos[:, None, :]
    s = sin[:, None, :]
    for x in (q, k):
        cx, sx = (c, s) if x.dtype == torch.float32 else (c.to(x.dtype), s.to(x.dtype))
        half = x.shape[-1] // 2
        x1 = x[..., :half]
        x2 = x[..., half:]
        first = x1 * cx - x2 * sx
        x2.mul_(cx).addcmul_(x1, sx)
        x1.copy_(first)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation: silu(gate) * up for gate_up = [gate | up] along the last dim."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul wants an even last dim ([gate | up]), got {gate_up.shape[-1]}")
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GeGLU activation (Gemma): gelu(gate, tanh approximation) * up for gate_up = [gate | up]."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gelu_tanh_mul wants an even last dim ([gate | up]), got {gate_up.shape[-1]}")
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def check_kv_write(k: torch.Tensor, v: torch.Tensor, k_cache, v_cache, slot_mapping: torch.Tensor) -> None:
    """Shared argument check for both write_kv paths: wrong shapes would silently corrupt other pages."""
    if k.shape != v.shape or k.dim() != 3:
        raise ValueError(f"write_kv wants k and v (T, Hkv, D) of one shape, got {tuple(k.shape)}, {tuple(v.shape)}")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be ({k.shape[0]},), got {tuple(slot_mapping.shape)}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.shape[2:] != k.shape[1:]:
            raise ValueError(f"{name} {tuple(cache.shape)} does not hold (Hkv, D) = {tuple(k.shape[1:])}")
    if type(k_cache) is not type(v_cache):
        raise ValueError("k_cache and v_cache must be the same kind of pool")


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache, v_cache, slot_mapping: torch.Tensor
) -> None:
    """Scatter this step's K/V rows into their physical slots (page * page_size + offset); a
    QuantizedPool quantizes them on the way in."""
    check_kv_write(k, v, k_cache, v_cache, slot_mapping)
    if isinstance(k_cache, QuantizedPool):
        k_cache.write(k, slot_mapping)
        v_cache.write(v, slot_mapping)
        return
    idx = slot_mapping.to(torch.int64)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, idx, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, idx, v.to(v_cache.dtype))


def dequant_matmul_reference(x: torch.Tensor, raw: torch.Tensor, qtype: int, shape: tuple[int, int]) -> torch.Tensor:
    """x @ W.T with W decoded from its GGUF blocks by the gguf package's numpy reference (what the
    Triton dequant-matmul kernels are tested against)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    w = dequantize(raw.cpu().numpy(), GGMLQuantizationType(qtype)).reshape(shape)
    return F.linear(x, torch.from_numpy(w.copy()).to(device=x.device, dtype=x.dtype))

"""pagedeck's compute kernels: one interface, Triton on CUDA tensors, plain torch everywhere else.

The Triton modules are imported lazily, on the first CUDA call, so the CPU engine (and platforms
without Triton) never import triton."""

from __future__ import annotations

import torch

from . import reference_attention as _attention
from . import reference as _ref
from .kv_quant import FORMATS as KV_QUANT_FORMATS
from .kv_quant import QuantizedPool, copy_page_prefix, copy_pages, make_pool, permute_pages, pool_nbytes
from .vocab import pad_embedding, pad_vocab

__all__ = [
    "rms_norm", "apply_rotary", "silu_mul", "gelu_tanh_mul", "write_kv", "paged_attention",
    "QuantizedPool", "make_pool", "copy_pages", "copy_page_prefix", "permute_pages", "pool_nbytes",
    "KV_QUANT_FORMATS",
    "pad_vocab", "pad_embedding", "use_triton", "plan_step", "StepPlan", "dequant_matmul",
]

_triton_ops = None


def use_triton(t: torch.Tensor) -> bool:
    """The one dispatch rule: CUDA tensors go to Triton."""
    return t.is_cuda


def _triton():
    global _triton_ops
    if _triton_ops is None:
        from . import triton_ops

        _triton_ops = triton_ops
    return _triton_ops


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual); without residual, (norm(x), x)."""
    if use_triton(x):
        return _triton().rms_norm(x, weight, eps, residual)
    return _ref.rms_norm(x, weight, eps, residual)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                 plan: "StepPlan | None" = None, attention_factor: float = 1.0) -> None:
    """Rotary embedding in place (HF rotate_half convention) at per-token absolute positions; cos and
    sin are multiplied by `attention_factor` (LongRoPE). q/k may be views of each head's first dims."""
    if use_triton(q):
        return _triton().apply_rotary(q, k, positions, inv_freq, attention_factor)
    tables = plan.rotary_tables(inv_freq, attention_factor) if plan is not None else None
    return _ref.apply_rotary(q, k, positions, inv_freq, tables, attention_factor)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up (T, 2I) = [gate | up] -> (T, I)."""
    if use_triton(gate_up):
        return _triton().silu_mul(gate_up)
    return _ref.silu_mul(gate_up)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up for gate_up (T, 2I) = [gate | up] -> (T, I) (GeGLU, Gemma)."""
    if use_triton(gate_up):
        return _triton().gelu_tanh_mul(gate_up)
    return _ref.gelu_tanh_mul(gate_up)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache, v_cache, slot_mapping: torch.Tensor) -> None:
    """Write K/V (T, Hkv, D) into slots page * page_size + offset of a tensor pool or a QuantizedPool."""
    if use_triton(k):
        return _triton().write_kv(k, v, k_cache, v_cache, slot_mapping)
    return _ref.write_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor, k_cache, v_cache, block_table: torch.Tensor, cu_q: torch.Tensor,
    kv_lens: torch.Tensor, scale: float, plan: "StepPlan | None" = None, window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Varlen causal attention through the page table (decode, chunked prefill, verification).

    `plan` (from plan_step) carries the layer-independent indexing of the torch path; Triton derives it
    on the device inside the kernel, so its plan holds nothing. `window`: a sliding-window layer sees only
    the last `window` positions (itself included); `softcap`: scores become softcap * tanh(s / softcap)."""
    if use_triton(q):
        return _triton().paged_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale, window, softcap)
    return _attention.paged_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale,
                                      plan.attention if plan is not None else None, window, softcap)


def dequant_matmul(x: torch.Tensor, raw: torch.Tensor, qtype: int, shape: tuple[int, int]) -> torch.Tensor:
    """x (M, K) @ W.T for W (N, K) stored as GGUF blocks `raw` (N, bytes per row) of ggml type `qtype`:
    the decode GEMV for a few rows, the tiled GEMM for prefill (Triton); the gguf reference elsewhere."""
    if use_triton(x):
        from . import triton_dequant

        if x.shape[0] <= 16:
            return triton_dequant.dequant_gemv(x, raw, qtype, shape)
        return triton_dequant.dequant_gemm(x, raw, qtype, shape)
    return _ref.dequant_matmul_reference(x, raw, qtype, shape)


class StepPlan:
    """Per-forward precomputation shared by all layers: rotary tables and the attention plan (torch path).

    Rotary tables are made on first use per (inv_freq, attention_factor): models whose sliding-window
    layers use another rope base (Gemma 3) get one table per base, still once per step."""

    def __init__(self, positions: torch.Tensor, inv_freq: torch.Tensor, block_table: torch.Tensor,
                 cu_q: torch.Tensor, kv_lens: torch.Tensor, page_size: int):
        self.positions = positions
        self._tables: dict = {}
        self.attention = None
        if not use_triton(positions):
            self.rotary_tables(inv_freq)
            self.attention = _attention.AttentionPlan(block_table, cu_q, kv_lens, page_size)

    def rotary_tables(self, inv_freq: torch.Tensor, attention_factor: float = 1.0):
        key = (inv_freq.data_ptr(), inv_freq.numel(), attention_factor)
        if key not in self._tables:
            self._tables[key] = _ref.rotary_tables(self.positions, inv_freq, attention_factor)
        return self._tables[key]


def plan_step(positions: torch.Tensor, inv_freq: torch.Tensor, block_table: torch.Tensor, cu_q: torch.Tensor,
              kv_lens: torch.Tensor, page_size: int) -> StepPlan:
    """Build once per forward, pass to apply_rotary and paged_attention of every layer."""
    return StepPlan(positions, inv_freq, block_table, cu_q, kv_lens, page_size)

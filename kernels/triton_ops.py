"""The Triton implementations behind kernels' public functions (imported only on first CUDA use)."""

from __future__ import annotations

import torch

from .reference_attention import check_attention_args, check_layer_options
from .kv_quant import QuantizedPool
from .triton_decode import decode_attention
from .triton_kv import write_kv
from .triton_lora import lora_expand, lora_shrink
from .triton_pointwise import apply_rotary, gelu_tanh_mul, rms_norm, silu_mul
from .triton_prefill import prefill_attention

__all__ = ["rms_norm", "apply_rotary", "silu_mul", "gelu_tanh_mul", "write_kv", "paged_attention", "lora_shrink",
           "lora_expand"]


def paged_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale, window=None, softcap=None,
                    sinks=None) -> torch.Tensor:
    """T == B means every sequence has one query token (q_len >= 1 each), so the split-KV decode kernel
    applies; anything else (prefill chunks, verification, mixed) goes to the varlen kernel. Deciding by
    shapes keeps the call free of device syncs, so it can be captured in a CUDA graph."""
    check_attention_args(q, k_cache, v_cache, block_table, cu_q, kv_lens)
    check_layer_options(window, softcap)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    if isinstance(k_cache, QuantizedPool):  # the pools hold rotated vectors (see kv_quant)
        out = _attend(k_cache.rotate(q).to(q.dtype), k_cache, v_cache, block_table, cu_q, kv_lens, scale, window,
                      softcap, sinks)
        return v_cache.unrotate(out).to(q.dtype)
    return _attend(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale, window, softcap, sinks)


def _attend(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale, window, softcap, sinks) -> torch.Tensor:
    if sinks is not None:  # the kernels read it in its own dtype, one logit a head
        sinks = sinks.contiguous()
    if q.shape[0] == kv_lens.shape[0]:
        return decode_attention(q, k_cache, v_cache, block_table, kv_lens, scale, window=window, softcap=softcap,
                                sinks=sinks)
    return prefill_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale, window=window, softcap=softcap,
                             sinks=sinks)

"""The paged K/V pools: per layer, (num_pages, page_size, n_kv_heads, head_dim) for keys and for values.

With kv_quant ("q8", "q6", "q4") each pool stores per-token groups of small integers plus scales
(kernels.kv_quant), so the same page table addresses two to four times as many tokens.
"""
from __future__ import annotations

import math

import torch

from kernels.kv_quant import QuantizedPool, copy_page_prefix, make_pool, permute_pages, pool_nbytes

from ..contract import DEFAULT_CACHE_TOKENS, DEFAULT_PAGE_SIZE, KV_QUANT_FORMATS, check_page_size
from .budget import HEADROOM, available_bytes, kv_cache_bytes
from .spec import CacheSpec


class PagedCache:
    """K/V storage shaped by pages; the page table (engine.cache.pagetable) decides what lives where.

    `spec`: a CacheSpec, or what gives one (`Model.cache_spec()`: `PagedCache(model, ...)` reads it). The
    cache keeps only the spec, never the model."""

    def __init__(self, spec, max_tokens: int = DEFAULT_CACHE_TOKENS, page_size: int = DEFAULT_PAGE_SIZE,
                 kv_quant: str | None = None):
        if not isinstance(spec, CacheSpec):
            spec = spec.cache_spec()
        if kv_quant not in KV_QUANT_FORMATS:
            raise ValueError(f"kv_quant must be one of {KV_QUANT_FORMATS}, got {kv_quant!r}")
        check_page_size(page_size)
        if max_tokens < page_size:
            raise ValueError(f"max_tokens ({max_tokens}) must hold at least one page of {page_size} tokens")
        self.spec = spec
        self.page_size = page_size
        self.num_pages = max_tokens // page_size
        self.max_tokens = self.num_pages * page_size
        self.kv_quant = kv_quant
        _check_memory(spec, self.max_tokens, kv_quant, page_size)

        def pool():
            if kv_quant is None:
                return make_pool(None, self.num_pages, page_size, spec.num_kv_heads, spec.head_dim,
                                 spec.dtype, spec.device)
            # Scale groups of 32 values, or the whole head when head_dim is smaller (tiny test models).
            return QuantizedPool.empty(kv_quant, self.num_pages, page_size, spec.num_kv_heads, spec.head_dim,
                                       device=spec.device, group_size=math.gcd(32, spec.head_dim))

        self.k = [pool() for _ in range(spec.num_layers)]
        self.v = [pool() for _ in range(spec.num_layers)]
        # Set by the one DynamicGenerator whose page table decides what these pages hold: two tables over one
        # pool would overwrite each other's K/V.
        self.claimed = False

    def copy_page(self, src: int, dst: int, n: int) -> None:
        """Copy the first n slots of page src into page dst in every layer (partial-page prefix reuse)."""
        for pool in (*self.k, *self.v):
            copy_page_prefix(pool, src, dst, n)

    def permute(self, new_order: list[int]) -> None:
        """Move pages so that slot k holds what page new_order[k] held (defragmentation)."""
        idx = torch.tensor(new_order, device=self.spec.device)
        for pool in (*self.k, *self.v):
            permute_pages(pool, idx)

    def memory_bytes(self) -> int:
        return sum(pool_nbytes(pool) for pool in (*self.k, *self.v))


def _check_memory(spec: CacheSpec, tokens: int, kv_quant: str | None, page_size: int) -> None:
    """Refuse a cache that cannot be allocated with a clear message, rather than an OOM kill mid-way."""
    need = kv_cache_bytes(spec, tokens, kv_quant, torch.empty(0, dtype=spec.dtype).element_size(), page_size)
    free = available_bytes(spec.device.type)
    if free is not None and need > free * HEADROOM:
        raise MemoryError(f"A KV cache of {tokens:,} tokens ({kv_quant or 'unquantized'}) needs {need / 2**30:.1f} GiB "
                          f"but only {free / 2**30:.1f} GiB is free: use a smaller cache or a quantized KV cache "
                          "(q8 halves it, q4 quarters it).")

"""The paged K/V pools: per layer, (num_pages, page_size, n_kv_heads, head_dim) for keys and for values."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .model import Model

KV_QUANT_FORMATS = (None, "q8", "q6", "q4")


class PagedCache:
    """K/V storage shaped by pages; the page table (engine.pagetable) decides what lives where."""

    def __init__(self, model: "Model", max_tokens: int = 8192, page_size: int = 256, kv_quant: str | None = None):
        if kv_quant not in KV_QUANT_FORMATS:
            raise ValueError(f"kv_quant must be one of {KV_QUANT_FORMATS}, got {kv_quant!r}")
        if kv_quant is not None:
            raise NotImplementedError(f"quantized KV cache ({kv_quant}) is not implemented yet (issue 3)")
        if page_size < 16 or page_size & (page_size - 1):
            raise ValueError(f"page_size must be a power of two >= 16, got {page_size}")
        if max_tokens < page_size:
            raise ValueError(f"max_tokens ({max_tokens}) must hold at least one page of {page_size} tokens")
        cfg = model.config
        self.model = model
        self.page_size = page_size
        self.num_pages = max_tokens // page_size
        self.max_tokens = self.num_pages * page_size
        self.kv_quant = kv_quant
        shape = (self.num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in range(cfg.num_layers)]

    def copy_page(self, src: int, dst: int, n: int) -> None:
        """Copy the first n slots of page src into page dst in every layer (partial-page prefix reuse)."""
        for pool in (*self.k, *self.v):
            pool[dst, :n] = pool[src, :n]

    def permute(self, new_order: list[int]) -> None:
        """Move pages so that slot k holds what page new_order[k] held (defragmentation)."""
        idx = torch.tensor(new_order, device=self.k[0].device)
        for pool in (*self.k, *self.v):
            pool.copy_(pool.index_select(0, idx))

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

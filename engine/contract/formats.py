"""Formats and defaults the engine accepts and the app offers: one list each, checked in one place."""
from __future__ import annotations

WEIGHT_FORMATS = ("auto", "dense", "packed", "q8")  # Model.load(weights=...): auto = packed for a GGUF on a CPU
WEIGHT_ALIASES = {"q4": "packed"}  # older names Model.load and the CLI still accept
WEIGHT_NAMES = WEIGHT_FORMATS + tuple(WEIGHT_ALIASES)  # every name a --weights option accepts
KV_QUANT_FORMATS = (None, "q8", "q6", "q4")  # PagedCache(kv_quant=...): None = the model dtype
DEFAULT_PAGE_SIZE = 256  # tokens per cache page
DEFAULT_CACHE_TOKENS = 8192  # PagedCache(max_tokens=...) and the app's cache size


def check_page_size(page_size: int) -> None:
    """Pages hold a power-of-two number of tokens, at least 16 (the kernels' tile)."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 16 or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two >= 16, got {page_size}")

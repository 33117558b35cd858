"""What memory is free, and what a PagedCache of a given size will take: the two numbers every
"will it fit" check (the cache's own, engine.model.catalog.memory's whole-model estimate) compares."""
from __future__ import annotations

import math
import os

from ..contract import DEFAULT_PAGE_SIZE

HEADROOM = 0.9  # leave a tenth of what is free for everything else


def available_bytes(device: str = "cpu") -> int | None:
    """Memory this process could still get: MemAvailable on Linux, free GPU memory on CUDA."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def kv_cache_bytes(config, cache_tokens: int, kv_quant: str | None, element_bytes: int, page_size: int = DEFAULT_PAGE_SIZE) -> int:
    """Bytes of PagedCache's K and V pools (whole pages, every layer), as kernels.kv_quant lays them out.
    `config`: what gives num_layers, num_kv_heads and head_dim (a ModelConfig or a CacheSpec)."""
    from kernels.kv_quant import slot_nbytes

    pages = max(cache_tokens // page_size, 1)
    group = math.gcd(32, config.head_dim)
    per_slot = slot_nbytes(kv_quant, config.num_kv_heads, config.head_dim, element_bytes, group)
    return 2 * config.num_layers * pages * page_size * per_slot

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


def pool_dtype(device: str, model_dtype, weight_format: str, fused: bool):
    """The element type of a model's unquantized K/V pools. Packed weights on a CPU whose attention the fused CPU
    kernel runs (`fused`: Model.fusable) keep fp16 pools under fp32 activations: a decode step's attention reads
    every cached position once per layer and is bound by those bytes, which fp16 halves (kernels/cpu/attention.cpp
    converts as it loads and rounds as it stores). That kernel attends every row over the K/V as stored, its own
    chunk's included, so the rounding never depends on how a prompt was chunked or a job preempted. Dense weights
    (the reference path), architectures the kernel does not serve and other devices keep the model's dtype.
    device: a device type ("cpu", "cuda"); weight_format: Model.weight_format ("dense" or a packed format)."""
    import torch

    if device == "cpu" and weight_format != "dense" and fused and model_dtype == torch.float32:
        return torch.float16
    return model_dtype


def pool_bytes(device: str, model_dtype: str, weight_format: str, fused: bool) -> int:
    """Bytes of one pool element (pool_dtype) for a model of dtype `model_dtype` ("float32", ...), from names alone."""
    import torch

    return pool_dtype(device, getattr(torch, model_dtype), weight_format, fused).itemsize

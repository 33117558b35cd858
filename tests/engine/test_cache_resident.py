"""A K/V cache costs resident memory only for the pages that hold tokens: creating the app's default-sized
cache must not commit the whole pool (it reads as zeros all the same), and filling N pages commits about
N pages' bytes."""
from __future__ import annotations

import ctypes
import gc
import mmap

import pytest
import torch

from engine.cache.paged_cache import PagedCache
from engine.cache.spec import CacheSpec

SPEC = CacheSpec(num_layers=2, num_kv_heads=8, head_dim=128, dtype=torch.float32, device=torch.device("cpu"))
PAGE = 256


def _anon_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))


def _resident_bytes(tensors) -> int:
    """Resident bytes of these tensors' own memory (mincore over each one's pages): the pools' pages, apart
    from whatever the allocator keeps of the writes' temporaries."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = mmap.PAGESIZE
    total = 0
    for t in tensors:
        start = t.data_ptr() // page * page
        length = t.data_ptr() + t.nbytes - start
        vec = ctypes.create_string_buffer(-(-length // page))
        assert libc.mincore(start, length, vec) == 0, ctypes.get_errno()
        total += sum(b & 1 for b in vec.raw) * page
    return total


def _pool_tensors(cache) -> list[torch.Tensor]:
    return [t for pool in (*cache.k, *cache.v) for t in ([pool] if isinstance(pool, torch.Tensor) else pool.tensors())]


@pytest.mark.parametrize("kv_quant", [None, "q8"])
def test_pools_become_resident_only_as_pages_are_written(kv_quant):
    gc.collect()
    before = _anon_bytes()
    cache = PagedCache(SPEC, max_tokens=8192, page_size=PAGE, kv_quant=kv_quant)
    created = _anon_bytes() - before
    pool_bytes = cache.memory_bytes()
    assert pool_bytes > 30 * 2**20
    assert created < 0.05 * pool_bytes  # not committed at creation
    assert _resident_bytes(_pool_tensors(cache)) == 0
    n = 4  # pages the page table would hand out
    page_bytes = pool_bytes // cache.num_pages
    x = torch.randn(n * PAGE, SPEC.num_kv_heads, SPEC.head_dim)
    slots = torch.arange(n * PAGE)
    for pool in (*cache.k, *cache.v):
        if kv_quant is None:
            pool.view(-1, SPEC.num_kv_heads, SPEC.head_dim)[slots] = x
        else:
            pool.write(x, slots)
    used = _resident_bytes(_pool_tensors(cache))
    assert 0.95 * n * page_bytes <= used <= n * page_bytes + 4 * 4096 * len(_pool_tensors(cache))
    # unwritten pages read as zeros, exactly as a zero-filled pool did
    pool = cache.k[0]
    rest = pool[n:] if kv_quant is None else pool.gather(torch.arange(n, n + 2), torch.float32)
    assert not rest.any()
    held = _anon_bytes()
    del cache, pool, rest
    gc.collect()
    assert held - _anon_bytes() >= 0.9 * used  # the mappings go with the cache

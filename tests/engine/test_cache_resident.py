"""A K/V cache costs resident memory only for the pages that hold tokens: creating the app's default-sized
cache must not commit the whole pool (it reads as zeros all the same), and filling N pages commits about
N pages' bytes."""
from __future__ import annotations

import ctypes
import errno
import gc
import mmap

import pytest
import torch

from engine.cache.paged_cache import PagedCache
from engine.cache.spec import CacheSpec

SPEC = CacheSpec(num_layers=2, num_kv_heads=8, head_dim=128, dtype=torch.float32, device=torch.device("cpu"))
PAGE = 256


def _ranges(tensors) -> list[tuple[int, int]]:
    """(page-aligned start, length) of each tensor's memory."""
    page = mmap.PAGESIZE
    return [(t.data_ptr() // page * page, t.data_ptr() + t.nbytes - t.data_ptr() // page * page) for t in tensors]


def _resident_bytes(ranges, unmapped_ok: bool = False) -> int:
    """Resident bytes in these address ranges (mincore over their pages): the pools' own pages, apart from
    whatever the allocator keeps of the writes' temporaries. With unmapped_ok, a page no longer mapped counts
    as not resident (mincore's ENOMEM), so a range can be checked after its mapping went."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = mmap.PAGESIZE
    total = 0
    for start, length in ranges:
        vec = ctypes.create_string_buffer(-(-length // page))
        if libc.mincore(start, length, vec) == 0:
            total += sum(b & 1 for b in vec.raw) * page
            continue
        assert unmapped_ok and ctypes.get_errno() == errno.ENOMEM, ctypes.get_errno()
        one = ctypes.create_string_buffer(1)
        total += sum(page for p in range(start, start + length, page) if libc.mincore(p, page, one) == 0 and one.raw[0] & 1)
    return total


def _pool_tensors(cache) -> list[torch.Tensor]:
    return [t for pool in (*cache.k, *cache.v) for t in ([pool] if isinstance(pool, torch.Tensor) else pool.tensors())]


@pytest.mark.parametrize("kv_quant", [None, "q8"])
def test_pools_become_resident_only_as_pages_are_written(kv_quant):
    gc.collect()
    cache = PagedCache(SPEC, max_tokens=8192, page_size=PAGE, kv_quant=kv_quant)
    pool_bytes = cache.memory_bytes()
    assert pool_bytes > 30 * 2**20
    # not committed at creation: none of the pools' pages resident
    assert _resident_bytes(_ranges(_pool_tensors(cache))) == 0
    n = 4  # pages the page table would hand out
    page_bytes = pool_bytes // cache.num_pages
    x = torch.randn(n * PAGE, SPEC.num_kv_heads, SPEC.head_dim)
    slots = torch.arange(n * PAGE)
    for pool in (*cache.k, *cache.v):
        if kv_quant is None:
            pool.view(-1, SPEC.num_kv_heads, SPEC.head_dim)[slots] = x
        else:
            pool.write(x, slots)
    used = _resident_bytes(_ranges(_pool_tensors(cache)))
    assert 0.95 * n * page_bytes <= used <= n * page_bytes + 4 * 4096 * len(_pool_tensors(cache))
    # unwritten pages read as zeros, exactly as a zero-filled pool did
    pool = cache.k[0]
    rest = pool[n:] if kv_quant is None else pool.gather(torch.arange(n, n + 2), torch.float32)
    assert not rest.any()
    ranges = _ranges(_pool_tensors(cache))
    del cache, pool, rest
    gc.collect()
    # the mappings go with the cache: the pools' own address ranges, not the whole process's anonymous memory
    # (which other threads' and the allocator's arenas move at any time), hold none of those pages any more
    assert _resident_bytes(ranges, unmapped_ok=True) <= 0.1 * used

"""The engine fixes glibc's mmap threshold at import: a large block freed does not send later blocks of
that size into the heap arenas, where a reload's freed model left holes that kept RSS growing."""
import ctypes

import pytest

from engine.model.heap import MMAP_THRESHOLD, fix_mmap_threshold
from tests.app.soak_meter import _MALLOC_MAPPED_MB


@pytest.mark.skipif(_MALLOC_MAPPED_MB is None, reason="glibc >= 2.33 only (mallinfo2)")
def test_a_large_block_freed_does_not_raise_the_mmap_threshold():
    """engine.model.heap is imported (and the threshold fixed) by engine.Model, the loaders and the generator."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(libc.malloc(8 << 20))  # freeing an 8 MiB mapping raises glibc's dynamic threshold to 8 MiB
    before = _MALLOC_MAPPED_MB()
    block = libc.malloc(1 << 20)
    try:
        assert _MALLOC_MAPPED_MB() - before >= 1.0, "a 1 MiB block came from the heap arenas"
    finally:
        libc.free(block)


def test_fixing_it_again_is_harmless():
    assert fix_mmap_threshold(MMAP_THRESHOLD) in (True, False)

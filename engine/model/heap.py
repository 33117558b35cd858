"""The heap, kept close to what is in use (glibc's malloc; every call a no-op elsewhere).

- `release_freed_memory`: malloc_trim(0), freed heap pages back to the OS (loading frees many medium-sized
  temporaries that glibc would otherwise keep: measured ~0.8 GB on a 0.8 GB Q4_K_M file).
- `fix_mmap_threshold` (at import): glibc serves a block at or above its mmap threshold by its own mapping,
  unmapped at free, and raises the threshold (up to 32 MiB) whenever such a block is freed. A load frees
  many, so afterwards weights, cache pools and step buffers below 32 MiB came from the heap arenas, and a
  reload freed ~0.8 GB in the middle of them: the free space glibc keeps grew at each reload (mallinfo2
  fordblks 0.2 -> 0.9 -> 1.7 GB in the app soak), small long-lived allocations spread over those holes, and
  each page with a live chunk in it stays resident, which no trim gives back: RSS crept +50 MB per 1000
  replies between reloads while the heap in use did not. A fixed threshold keeps large blocks out of the
  heap (the same run: kept 54-162 MB, RSS flat to 0.4 MB between reloads); a mapping per large step
  buffer costs its page faults, small beside a step. An explicit MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES
  setting is left alone.
"""
from __future__ import annotations

import functools
import os

M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MMAP_THRESHOLD = 256 * 1024


@functools.lru_cache(maxsize=1)
def _libc():
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
        return lib if lib is not None and hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


def release_freed_memory() -> None:
    """Return freed heap memory to the OS (glibc's malloc_trim; a no-op elsewhere)."""
    lib = _libc()
    if lib is not None:
        lib.malloc_trim(0)


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Serve blocks of `size` bytes and more by their own mappings from now on, without glibc's dynamic
    raise; True if set (False without glibc, or where the environment already sets it)."""
    lib = _libc()
    if lib is None or "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    return bool(lib.mallopt(M_MMAP_THRESHOLD, size))


fix_mmap_threshold()  # before the first model's blocks: engine.Model, its loaders and the generator import this module

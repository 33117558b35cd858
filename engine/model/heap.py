"""Giving freed heap memory back to the OS while loading (glibc's malloc_trim; a no-op elsewhere)."""

from __future__ import annotations

import functools


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
    """Return freed heap memory to the OS (glibc's malloc_trim; a no-op elsewhere). Loading frees many
    medium-sized temporaries that glibc would otherwise keep: measured ~0.8 GB on a 0.8 GB Q4_K_M file."""
    lib = _libc()
    if lib is not None:
        lib.malloc_trim(0)

"""The C heap while loading: freed memory given back to the OS, and the model's large blocks kept out of the
arenas (glibc's malloc_trim and mallopt; no-ops elsewhere).

glibc serves a request from a free chunk of its arenas if one fits; otherwise it maps a new block on its own
when the request is at least the mmap threshold, which starts at 128 KB and rises to the size of each mapped
block freed, up to 32 MB. A load frees large temporaries early, so the threshold climbs and the model's
tensors (most under 32 MB) land inside the arenas between the load's small long-lived objects. When the
model is freed at the next load, every page such a tensor shares with a live object stays resident: on the
default model RSS crept with every reload, trimmed or not, until it levelled off some 25 MB above the first
load (a third of the model's weights).
`loading_heap()` holds the threshold at `LOAD_MMAP_THRESHOLD` while a model loads, so the new blocks of 4 MB
or more get mappings of their own and go back whole when freed (the same reloads level off at about half
that), and at 32 MB after, where the dynamic rule settles. The trim threshold is left as it is (set to the
rule's 64 MB as well, it kept more of the arenas' holes resident across reloads). A low threshold while
serving too cost ~15 % of prefill (activations mapped and faulted in afresh at every step)."""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
LOAD_MMAP_THRESHOLD = 4 << 20
SERVE_MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems


@functools.lru_cache(maxsize=1)
def _libc():
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
        return lib if lib is not None and hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt") else None
    except OSError:
        return None


def release_freed_memory() -> None:
    """Return freed heap memory to the OS (glibc's malloc_trim; a no-op elsewhere). Loading frees many
    medium-sized temporaries that glibc would otherwise keep: measured ~0.8 GB on a 0.8 GB Q4_K_M file."""
    lib = _libc()
    if lib is not None:
        lib.malloc_trim(0)


_loads = 0  # loads in progress (models load side by side in a many-model server)
_loads_lock = threading.Lock()


@contextmanager
def loading_heap():
    """While the block runs, new blocks of `LOAD_MMAP_THRESHOLD` bytes or more (none of the arenas' free chunks
    fitting) are mapped on their own; the threshold is `SERVE_MMAP_THRESHOLD` once no load is in progress (the
    setting is process-wide: loads side by side keep it until the last ends)."""
    global _loads
    lib = _libc()
    with _loads_lock:
        _loads += 1
        if lib is not None and _loads == 1:
            lib.mallopt(M_MMAP_THRESHOLD, LOAD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        with _loads_lock:
            _loads -= 1
            if lib is not None and _loads == 0:
                lib.mallopt(M_MMAP_THRESHOLD, SERVE_MMAP_THRESHOLD)

"""Asking the kernel to read a mapped tensor's file pages ahead, before packing copies them.

The loader packs from a private map of the GGUF (engine.model.gguf.file). Where the file is not in the page
cache (a first load, or a file larger than what the page cache keeps, as a 4 GB gpt-oss file's MXFP4 experts
on a loaded machine) every fault of the copy reads a small readahead window synchronously; copying a cold
map tile by tile as the packers do took 2-4x the CPU time of the same copy after madvise(MADV_WILLNEED) over
the range (in chunks the kernel takes whole), which starts the whole read at once. The hint reads into the
page cache only: no page is mapped into the process (its RSS, and the load's peak, do not change). Chunks
already cached are skipped after a one-page mincore; anonymous memory (rows copied to be unpermuted) takes
the hint as a no-op.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap

import torch

_MADV_WILLNEED = 3
_CHUNK = 8 << 20  # Linux reads at most its readahead limit (here ~8 MB) a hint: the range goes in chunks
_libc = None


def _libc_calls():
    """(madvise, mincore) from libc, or None where they cannot be called (reading ahead is only a hint)."""
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
            _libc = (lib.madvise, lib.mincore)
        except (OSError, AttributeError):
            _libc = False
    return _libc


def read_ahead(t: torch.Tensor) -> None:
    """Start reading the pages under the contiguous CPU tensor `t` (a view of a mapped file) into the page
    cache; a hint: nothing is read into the process and nothing fails. A chunk whose first page is cached
    already (a warm file) is left alone: the hint's walk over cached pages cost ~15 ms a GB."""
    calls = _libc_calls()
    if not calls or t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
        return
    madvise, mincore = calls
    start = t.data_ptr() // mmap.PAGESIZE * mmap.PAGESIZE
    stop = t.data_ptr() + t.numel() * t.element_size()
    cached = ctypes.create_string_buffer(1)
    for at in range(start, stop, _CHUNK):
        if mincore(at, 1, cached) == 0 and cached.raw[0] & 1:
            continue
        madvise(at, min(_CHUNK, stop - at), _MADV_WILLNEED)

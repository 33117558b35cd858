"""The bench reads model files into the page cache before timing any engine's load, so both engines load from
memory (the one loading second would otherwise be favoured by the first's reads)."""
from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from engine.bench.measure import read_through

libc = ctypes.CDLL(None, use_errno=True)


def cached_fraction(path) -> float:
    """Fraction of the file's pages in the page cache (mincore over a copy-on-write map of it)."""
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        start = ctypes.c_char.from_buffer(m)  # the map's address; nothing is read or written through it
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vec)
        del start
    assert rc == 0, os.strerror(ctypes.get_errno())
    return sum(v & 1 for v in vec) / pages


def test_read_through_leaves_every_page_of_the_files_in_the_page_cache(tmp_path):
    files = []
    for i in range(2):
        path = tmp_path / f"part{i}.bin"
        path.write_bytes(os.urandom(3 << 20) + b"tail")
        files.append(path)
    os.sync()  # written pages are dirty until written back; clean ones leave the cache at once on DONTNEED
    for path in files:
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if any(cached_fraction(p) > 0.5 for p in files):
        pytest.skip("this filesystem keeps the files in memory (tmpfs): nothing to read back")
    assert read_through(files, chunk=1 << 20) == sum(p.stat().st_size for p in files)
    assert all(cached_fraction(p) == 1.0 for p in files)

"""packing.readahead.read_ahead brings a mapped file's pages into the page cache (mincore sees them) without
mapping them into the process (its RSS stays), and takes tensors that are no file map as a no-op."""
import ctypes
import mmap
import os
import time

import torch

from engine.model.packing.readahead import read_ahead

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def _cached_pages(addr: int, size: int) -> int:
    """How many pages of [addr, addr + size) (page aligned) are in the page cache."""
    pages = size // mmap.PAGESIZE
    vec = ctypes.create_string_buffer(pages)
    assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
    return sum(b & 1 for b in vec.raw)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


def test_read_ahead_fills_the_page_cache_not_the_process(tmp_path):
    path, size = tmp_path / "blob.bin", 32 << 20
    path.write_bytes(os.urandom(size))
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache: a cold file
        m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    t = torch.frombuffer(m, dtype=torch.uint8).view(-1, 1024)
    addr = t.data_ptr()
    before, rss = _cached_pages(addr, size), _rss_bytes()
    assert before < size // mmap.PAGESIZE // 4
    read_ahead(t)
    deadline = time.monotonic() + 10
    while _cached_pages(addr, size) < size // mmap.PAGESIZE and time.monotonic() < deadline:
        time.sleep(0.01)  # the read is asynchronous
    assert _cached_pages(addr, size) == size // mmap.PAGESIZE
    assert _rss_bytes() - rss < size // 4  # cached, not mapped into the process
    del t
    m.close()


def test_no_op_on_memory_that_is_no_file_map():
    t = torch.arange(1 << 16, dtype=torch.int32)
    read_ahead(t)
    read_ahead(t[::2])  # not contiguous: left alone
    read_ahead(torch.empty(0))
    assert torch.equal(t, torch.arange(1 << 16, dtype=torch.int32))

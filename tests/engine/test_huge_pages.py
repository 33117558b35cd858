"""Loaded weights move onto 2 MB pages in the background (engine.model.huge_pages): whole 2 MB ranges only,
contents untouched, the model's outputs the same bits, and PAGEDECK_HUGE_PAGES=0 keeps 4 KB pages.

Only a kernel that cannot collapse a range (the probe below, which asks the kernel itself and not the module
under test) skips: where the kernel can, a loader that no longer moves the weights fails."""

import ctypes
import ctypes.util
import errno
import functools
import mmap
import time

import pytest
import torch

from engine import Model
from engine.cache.paged_cache import PagedCache
from engine.model import huge_pages
from engine.model.batch import Batch
from tools.models.synthetic_gguf import write_random_gguf

MB = 1 << 20


def huge_kb(addr: int, size: int = 1) -> int:
    """AnonHugePages of the mappings overlapping [addr, addr + size) (/proc/self/smaps): not changed by what the
    rest of the process frees meanwhile (the process-wide figure was, in the full suite), and whole however the
    kernel splits the allocator's mappings around a buffer (a buffer's head can sit in a mapping of its own)."""
    total, inside, found = 0, False, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo < addr + size and addr < hi
                found |= inside
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1])
    if not found:
        raise AssertionError(f"no mapping holds {addr:#x}")
    return total


@functools.lru_cache(maxsize=1)
def kernel_collapses() -> bool:
    """Whether this kernel turns a process's private memory into a 2 MB page on MADV_COLLAPSE (Linux 6.1+, THP
    built in and not forbidden to this process): asked of the kernel through libc on a mapping of our own,
    and confirmed in /proc/self/smaps. A refusal for want of a free 2 MB page now (EAGAIN, ENOMEM) is retried."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes, libc.madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    area = mmap.mmap(-1, 2 * huge_pages.HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(area)
    try:
        start = -(-ctypes.addressof(view) // huge_pages.HUGE_PAGE) * huge_pages.HUGE_PAGE  # one whole page inside
        area[:] = b"\1" * len(area)
        for _ in range(10):
            if libc.madvise(start, huge_pages.HUGE_PAGE, 25) == 0:  # MADV_COLLAPSE, linux/mman.h
                return huge_kb(start) >= huge_pages.HUGE_PAGE // 1024
            if ctypes.get_errno() not in (errno.EAGAIN, errno.ENOMEM):
                return False
            time.sleep(0.2)
        return False
    finally:
        del view
        area.close()


needs_collapse = pytest.mark.skipif(not kernel_collapses(), reason="this kernel cannot collapse memory into 2 MB "
                                    "pages (no MADV_COLLAPSE before Linux 6.1, or transparent huge pages off)")


def test_only_whole_2mb_ranges_inside_each_storage_are_taken():
    small, big = torch.empty(MB, dtype=torch.uint8), torch.empty(9 * MB + 123, dtype=torch.uint8)
    ranges = huge_pages.aligned_ranges([small.untyped_storage(), big.untyped_storage()])
    assert len(ranges) == 1
    start, length = ranges[0]
    lo, hi = big.data_ptr(), big.data_ptr() + big.numel()
    assert start % huge_pages.HUGE_PAGE == 0 and length % huge_pages.HUGE_PAGE == 0
    assert lo <= start and start + length <= hi and length >= (hi - lo) - 2 * huge_pages.HUGE_PAGE


@needs_collapse
def test_collapse_keeps_the_contents():
    buf = torch.randint(0, 256, (24 * MB,), dtype=torch.uint8)
    before = buf.clone()
    ranges = huge_pages.aligned_ranges([buf.untyped_storage()])
    done, refused = huge_pages.collapse(ranges)
    # every whole 2 MB page accounted for: collapsed, or refused by the kernel for want of a free 2 MB page after
    # the retries (a machine deep in a long run may have none to give: compaction fails); not one skipped
    assert done + refused == sum(n for _, n in ranges) and done >= 2 * MB
    # huge pages back the buffer when smaps is read, though not necessarily all: the kernel may split a collapsed
    # page again before that (it did once in a full-suite run, 20 of 22 MB still huge): speed, never contents
    assert huge_kb(buf.data_ptr(), buf.numel()) >= 2 * 1024
    assert torch.equal(buf, before)


def test_a_step_refused_for_want_of_memory_is_retried_page_by_page(monkeypatch):
    """The kernel stops a call at the first 2 MB page it cannot allocate, so the pages after it are retried one at
    a time (a libc stand-in refuses as a fragmented machine does: no such machine can be made on demand)."""
    calls = []

    def madvise(at, n, advice):
        calls.append((at, n))
        refuse = n == huge_pages.STEP or (at == 3 * huge_pages.HUGE_PAGE and calls.count((at, n)) == 1)
        ctypes.set_errno(errno.ENOMEM if refuse else 0)
        return -1 if refuse else 0

    monkeypatch.setattr(huge_pages, "_madvise", lambda: madvise)
    monkeypatch.setattr(huge_pages, "RETRY_WAITS", (0, 0))
    page = huge_pages.HUGE_PAGE
    assert huge_pages.collapse([(0, 10 * page)]) == (10 * page, 0)
    assert calls.count((3 * page, page)) == 2  # the page refused once, asked again
    monkeypatch.setattr(huge_pages, "RETRY_WAITS", ())
    calls.clear()
    monkeypatch.setattr(huge_pages, "_madvise", lambda: lambda at, n, advice: (ctypes.set_errno(errno.ENOMEM), -1)[1])
    # no 2 MB page anywhere: the rest is left after GIVE_UP pages in a row, and counted as refused
    assert huge_pages.collapse([(0, 10 * page)]) == (0, 10 * page)


@pytest.fixture(scope="module")
def path(tmp_path_factory):  # the 49k-row q8 head: the only matrix past 2 MB
    return write_random_gguf(tmp_path_factory.mktemp("huge") / "m.gguf", "tiny-256", 2, "Q8_0")


def logits(model: Model) -> torch.Tensor:
    cache = PagedCache(model, max_tokens=64, page_size=16)
    out = [model.forward(Batch.build([(list(range(3, 12)), 0, [0])], 16, [9]), cache)]
    out.append(model.forward(Batch.build([([20], 9, [0])], 16, [1], prompt_seqs=[False]), cache))
    return torch.cat(out)


@needs_collapse
def test_a_loaded_model_moves_and_answers_the_same(path, monkeypatch):
    monkeypatch.setenv("PAGEDECK_HUGE_PAGES", "0")
    plain = Model.load(path, weights="packed")
    assert plain.settle_thread is None
    monkeypatch.delenv("PAGEDECK_HUGE_PAGES")
    moved = Model.load(path, weights="packed")
    assert moved.settle_thread is not None, "the loader did not start moving the weights onto 2 MB pages"
    moved.settle_thread.join(timeout=60)
    assert not moved.settle_thread.is_alive()
    head = moved.lm_head.blocks[0]  # the 13 MB q8 head's codes: at least five whole 2 MB pages, of which a
    # machine short of free 2 MB pages may give only some (see test_collapse_keeps_the_contents)
    assert huge_kb(head.data_ptr(), head.numel() * head.element_size()) >= 2 * 1024
    assert torch.equal(logits(moved), logits(plain))

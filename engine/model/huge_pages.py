"""Loaded weights moved onto transparent huge pages, in the background.

A decode step reads every weight once: ~1.2 GB a token for an 8B-shaped Q4_K_M model. On 4 KB pages that is a
TLB miss every 4 KB, and most systems hand out 2 MB pages only where a program asks (THP "madvise" mode).
Asking at allocation (MADV_HUGEPAGE before the loader writes) made decode ~8-10 % faster on an 8B-shaped file
but loading 2.5-3x slower in a VM, where each fresh 2 MB page is first populated by the host (0.6 -> 1.5-2.1 s,
`python -m engine bench-load`). So the loader writes plain pages and a background thread then asks the kernel
to collapse each weight buffer's whole 2 MB ranges in place (MADV_COLLAPSE, Linux 6.1+), a few MB at a time,
at the lowest CPU priority, so that it takes the time decode leaves idle (engine.model.settle runs it last,
after the weights have settled); decode reads the same bytes before and after. PAGEDECK_HUGE_PAGES=0 turns it
off (to compare); where the kernel lacks MADV_COLLAPSE the thread stops at the first refusal.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys
import threading
import time
from typing import NamedTuple

import torch

from .. import envs

HUGE_PAGE = 2 << 20
MADV_COLLAPSE = 25  # linux/mman.h
STEP = 16 << 20  # bytes a call: short calls, so a reload or exit never waits long
TRANSIENT = (11, 12)  # EAGAIN (a page busy), ENOMEM (no free 2 MB page now): worth a retry
RETRY_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8)  # seconds between a refused page's tries
GIVE_UP = 4  # pages refused in a row, after their retries, before the rest is left on 4 KB pages

log = logging.getLogger(__name__)


def aligned_ranges(storages: list[torch.UntypedStorage]) -> list[tuple[int, int]]:
    """(address, length) of the whole 2 MB pages inside each CPU storage, largest first."""
    out = []
    for s in storages:
        if s.device.type != "cpu" or s.nbytes() < HUGE_PAGE:
            continue
        start = -(-s.data_ptr() // HUGE_PAGE) * HUGE_PAGE
        stop = (s.data_ptr() + s.nbytes()) // HUGE_PAGE * HUGE_PAGE
        if stop > start:
            out.append((start, stop - start))
    return sorted(out, key=lambda r: -r[1])


@functools.lru_cache(maxsize=1)
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name, use_errno=True).madvise if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


class Collapsed(NamedTuple):
    """What collapse() did: bytes now on 2 MB pages, and bytes the kernel kept refusing for want of a free 2 MB
    page (or a busy page) after every retry; the two add up to the ranges' length unless it stopped early."""
    done: int
    refused: int


def _collapse_page(madvise, at: int) -> int:
    """MADV_COLLAPSE one 2 MB page, retried while the kernel says busy or short of memory (compaction or another
    process may free a 2 MB page within a second); 0 if done, else the last errno."""
    for wait in (*RETRY_WAITS, None):
        if madvise(at, HUGE_PAGE, MADV_COLLAPSE) == 0:
            return 0
        err = ctypes.get_errno()
        if err not in TRANSIENT or wait is None:
            return err
        time.sleep(wait)


def collapse(ranges: list[tuple[int, int]]) -> Collapsed:
    """MADV_COLLAPSE each range, STEP bytes a call (ctypes lets the GIL go). A step the kernel refuses as busy or
    short of memory is retried a page at a time (the kernel stops a call at the first page it cannot allocate, so
    one refusal would otherwise leave up to STEP bytes on 4 KB pages for good); after GIVE_UP pages refused in a
    row the machine has no 2 MB pages to give and the rest is left. Stops at any other refusal (an old kernel:
    EINVAL). The storages are not held: a model dropped meanwhile (a reload) must not stay in memory beside the
    next one; collapsing a range freed or reused since only changes its page size, never its contents, and an
    unmapped one is refused."""
    madvise = _madvise()
    done = refused = in_a_row = 0
    if madvise is None:
        return Collapsed(0, 0)
    for start, length in ranges:
        for at in range(start, start + length, STEP):
            n = min(STEP, start + length - at)
            if madvise(at, n, MADV_COLLAPSE) == 0:
                done, in_a_row = done + n, 0
                continue
            err = ctypes.get_errno()
            for page in range(at, at + n, HUGE_PAGE) if err in TRANSIENT else ():
                if in_a_row >= GIVE_UP:  # no 2 MB page to be had now: the rest of this step stays as it is
                    refused += at + n - page
                    break
                err = _collapse_page(madvise, page)
                if err == 0:
                    done, in_a_row = done + HUGE_PAGE, 0
                elif err in TRANSIENT:
                    refused, in_a_row = refused + HUGE_PAGE, in_a_row + 1
                else:
                    break
            if err not in (0, *TRANSIENT):  # an old kernel (EINVAL), an unmapped range: nothing more to do
                log.debug("MADV_COLLAPSE refused (errno %d): weights stay on 4 KB pages", err)
                return Collapsed(done, refused)
    if refused:
        log.debug("%d MB of weights stay on 4 KB pages: no free 2 MB page", refused >> 20)
    return Collapsed(done, refused)


def lowest_priority() -> None:
    """This thread at the lowest CPU priority (nice 19, this thread only): each collapsed page is a 2 MB copy,
    and on two cores the copies beside a decode step made its first seconds' steps 2-7x slower (Qwen2.5-1.5B
    Q6_K: 52-267 ms against ~31); at nice 19 the steps keep their pace and the copies take the idle time between
    them. Not Linux, or not allowed: the thread competes as any other."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def enabled() -> bool:
    """Whether weights go onto 2 MB pages here: MADV_COLLAPSE callable, not turned off by PAGEDECK_HUGE_PAGES=0
    (engine.model.settle collapses the settled weights' ranges where so)."""
    return _madvise() is not None and envs.PAGEDECK_HUGE_PAGES


def wanted(storages: list[torch.UntypedStorage]) -> bool:
    """Whether collapsing these storages has anything to do: enabled, and 2 MB ranges among them."""
    return enabled() and bool(aligned_ranges(storages))

"""The app soak's meter: RSS read after a trim really leaves out the heap freed but kept, and the
between-reloads slope counts growth, not a reload's step or one noisy sample."""
from __future__ import annotations

import ctypes

import pytest

from engine.model.heap import release_freed_memory
from tests.app.soak_meter import growth_split, heap_mb, slope_between, status_mb


def _rows(values, every=25):
    return [{"replies": every * (i + 1), "rss": v} for i, v in enumerate(values)]


def test_slope_ignores_reload_steps_and_levels_each_stretch():
    # flat at 1600 MB, a reload after reply 100 steps it to 1615: no growth between reloads
    rows = _rows([1600, 1600, 1600, 1600, 1615, 1615, 1615, 1615])
    assert slope_between(rows, [100], "rss", settle=0) == pytest.approx(0.0)
    # the same with real growth of 40 MB per 1000 replies (1 MB per 25) in both stretches
    rows = _rows([1600 + i for i in range(4)] + [1620 + i for i in range(4, 8)])
    assert slope_between(rows, [100], "rss", settle=0) == pytest.approx(40.0)


def test_slope_is_not_two_end_samples():
    # flat, each sample a few MB off (the phase of the sample against the generator's trim), the stretch's
    # first sample low and its last high: the endpoint sum reads that as growth, the slope over all far less
    noise = [0, 3, -3, 3, -3, 6]
    rows = _rows([1600 + n for n in noise] + [1615 + n for n in noise])
    endpoints, _ = growth_split(rows, [150], "rss")
    assert endpoints == pytest.approx(12 / 250 * 1000)  # 48 MB per 1000
    assert slope_between(rows, [150], "rss", settle=0) < endpoints / 2


def test_slope_leaves_the_new_generators_first_replies_to_the_reload():
    # the first sample after the reload (5 replies in) has not yet the new generator's buffers
    rows = [{"replies": r, "rss": v} for r, v in [(50, 1600), (75, 1600), (100, 1600), (105, 1605),
                                                  (125, 1612), (150, 1612), (175, 1612)]]
    assert slope_between(rows, [100], "rss", settle=0) > 20
    assert slope_between(rows, [100], "rss", settle=10) == pytest.approx(0.0)


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc >= 2.33 only")
def test_trim_gives_back_heap_freed_but_kept():
    """What the meter judges (RSS after release_freed_memory) leaves out freed heap that glibc kept: 64 MB
    of 64 KiB blocks (below the mmap threshold: heap chunks) freed under one block still in use, so the
    heap's top can't shrink by itself, stay resident until the trim."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    release_freed_memory()
    blocks = [libc.malloc(64 * 1024) for _ in range(1024)]
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, 64 * 1024)  # resident
    for b in blocks[:-1]:
        libc.free(b)
    try:
        kept_before = heap_mb()[1]
        anon_before = status_mb("RssAnon")[0]
        release_freed_memory()
        anon_after = status_mb("RssAnon")[0]
        assert kept_before >= 60, kept_before  # glibc keeps the freed blocks...
        assert anon_before - anon_after >= 48, (anon_before, anon_after)  # ...and the trim gives them back
    finally:
        libc.free(blocks[-1])


_ARENAS_CHECK = """
import ctypes, threading
from tests.app.soak_meter import arenas_mb
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
held = []
def grab():
    held.extend(libc.malloc(4096) for _ in range(4096))
before = arenas_mb()
grab()
main = arenas_mb()
worker = threading.Thread(target=grab)
worker.start()
worker.join()
after = arenas_mb()
print(main[0] - before[0], after[0] - main[0], sum(after[1:]) - sum(main[1:]))
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc >= 2.33 only")
def test_arenas_tell_the_main_threads_heap_from_other_threads():
    """16 MB of 4 KiB blocks malloc'd on the main thread show in the main arena's figure; the same from
    another thread show in the other arenas, not the main one.

    Run in a fresh interpreter: glibc gives a new thread its own arena only while the process has fewer
    live threads than its arena limit (8 per core); past it, it hands out the existing arenas in turn, the
    main one included, and a test process that has run the suite holds dozens of live threads."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _ARENAS_CHECK], cwd=root, env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    on_main, main_after_worker, others_after_worker = map(float, out.split())
    assert on_main == pytest.approx(16, abs=2)
    assert main_after_worker == pytest.approx(0, abs=1)
    assert others_after_worker == pytest.approx(16, abs=2)

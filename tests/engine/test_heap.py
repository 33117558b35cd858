"""While a model loads, glibc maps every new block of 4 MB or more on its own (so freeing the model gives it
back whole, not as holes between live objects); once no load is in progress such blocks extend the arenas
again. Read through mallinfo2's hblkhd (bytes in blocks glibc maps on their own; tests.app.soak_meter's
reader) in a fresh process, whose arenas hold no free chunk of the probe's size (glibc reuses a free chunk
before it maps a new block)."""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from engine.model import heap

try:
    _glibc = hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2") and heap._libc() is not None
except OSError:
    _glibc = False
if not _glibc:
    pytest.skip("needs glibc >= 2.33 (mallinfo2, mallopt)", allow_module_level=True)

BLOCK = 16 << 20  # above the load threshold, below the serving one

_PROBE = """
import ctypes, json, sys, threading
from engine.model import heap
from tests.app.soak_meter import MB, _malloc_mapped_mb

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
BLOCK = int(sys.argv[1])

def mapped_by_a_block():  # how much glibc's own mappings grow while one BLOCK is allocated
    before = _malloc_mapped_mb()
    p = libc.malloc(BLOCK)
    try:
        return round((_malloc_mapped_mb() - before) * MB)
    finally:
        libc.free(p)

seen = {}
if sys.argv[2] == "one":
    with heap.loading_heap():
        seen["loading"] = mapped_by_a_block()
    seen["after"] = mapped_by_a_block()
    print(json.dumps(seen))
    sys.exit()
entered, release = threading.Event(), threading.Event()

def other_load():
    with heap.loading_heap():
        entered.set()
        release.wait(10)

t = threading.Thread(target=other_load)
with heap.loading_heap():
    t.start()
    entered.wait(10)
seen["one_of_two_ended"] = mapped_by_a_block()
release.set()
t.join()
seen["both_ended"] = mapped_by_a_block()
print(json.dumps(seen))
"""


def probe(scenario: str) -> dict:
    """Each scenario in a fresh process: a block freed after a load stays in the arena's free top (up to the
    serving trim threshold) and would serve the next probe."""
    out = subprocess.run([sys.executable, "-c", _PROBE, str(BLOCK), scenario], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_load_maps_large_blocks_and_serving_keeps_them_in_the_arenas():
    seen = probe("one")
    assert seen["loading"] >= BLOCK, seen
    assert seen["after"] == 0, seen


def test_overlapping_loads_keep_the_load_threshold_until_the_last_ends():
    seen = probe("two")
    assert seen["one_of_two_ended"] >= BLOCK, seen  # the other load still runs
    assert seen["both_ended"] == 0, seen

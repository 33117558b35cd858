"""Loaded weights move onto 2 MB pages in the background (engine.model.huge_pages): whole 2 MB ranges only,
contents untouched, the model's outputs the same bits, and PAGEDECK_HUGE_PAGES=0 keeps 4 KB pages."""

import pytest
import torch

from engine import Model
from engine.cache.paged_cache import PagedCache
from engine.model import huge_pages
from engine.model.batch import Batch
from tools.synthetic_gguf import write_random_gguf

MB = 1 << 20


def huge_kb(addr: int) -> int:
    """AnonHugePages of the mapping holding `addr` (/proc/self/smaps): not changed by what the rest of the
    process frees meanwhile (the process-wide figure was, in the full suite)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_only_whole_2mb_ranges_inside_each_storage_are_taken():
    small, big = torch.empty(MB, dtype=torch.uint8), torch.empty(9 * MB + 123, dtype=torch.uint8)
    ranges = huge_pages.aligned_ranges([small.untyped_storage(), big.untyped_storage()])
    assert len(ranges) == 1
    start, length = ranges[0]
    lo, hi = big.data_ptr(), big.data_ptr() + big.numel()
    assert start % huge_pages.HUGE_PAGE == 0 and length % huge_pages.HUGE_PAGE == 0
    assert lo <= start and start + length <= hi and length >= (hi - lo) - 2 * huge_pages.HUGE_PAGE


def test_collapse_keeps_the_contents():
    buf = torch.randint(0, 256, (24 * MB,), dtype=torch.uint8)
    before = buf.clone()
    done = huge_pages.collapse(huge_pages.aligned_ranges([buf.untyped_storage()]))
    if done == 0:
        pytest.skip("this kernel has no MADV_COLLAPSE (Linux < 6.1) or no transparent huge pages")
    assert done >= 20 * MB and huge_kb(buf.data_ptr()) >= done // 1024  # its mapping may hold more
    assert torch.equal(buf, before)


@pytest.fixture(scope="module")
def path(tmp_path_factory):  # the 49k-row q8 head: the only matrix past 2 MB
    return write_random_gguf(tmp_path_factory.mktemp("huge") / "m.gguf", "tiny-256", 2, "Q8_0")


def logits(model: Model) -> torch.Tensor:
    cache = PagedCache(model, max_tokens=64, page_size=16)
    out = [model.forward(Batch.build([(list(range(3, 12)), 0, [0])], 16, [9]), cache)]
    out.append(model.forward(Batch.build([([20], 9, [0])], 16, [1], prompt_seqs=[False]), cache))
    return torch.cat(out)


def test_a_loaded_model_moves_and_answers_the_same(path, monkeypatch):
    probe = torch.zeros(8 * MB, dtype=torch.uint8)
    supported = huge_pages.collapse(huge_pages.aligned_ranges([probe.untyped_storage()])) > 0
    del probe
    monkeypatch.setenv("PAGEDECK_HUGE_PAGES", "0")
    plain = Model.load(path, weights="packed")
    assert plain.huge_page_thread is None
    monkeypatch.delenv("PAGEDECK_HUGE_PAGES")
    moved = Model.load(path, weights="packed")
    if not supported or moved.huge_page_thread is None:
        pytest.skip("this kernel has no MADV_COLLAPSE (Linux < 6.1) or no transparent huge pages")
    moved.huge_page_thread.join(timeout=60)
    assert not moved.huge_page_thread.is_alive()
    head = moved.lm_head.blocks[0]  # the 13 MB q8 head's codes: at least four whole 2 MB pages
    assert huge_kb(head.data_ptr()) >= 8 * 1024
    assert torch.equal(logits(moved), logits(plain))

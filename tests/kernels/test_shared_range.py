"""The loader's repackers split their work with kernels/cpu/shared_range.h (the calling thread and helper threads
that join when they get a core): every piece of a matrix is written exactly once, whichever thread takes it,
and two loads at once (the many-model server) each get their own bits."""
from __future__ import annotations

import threading

import pytest
import torch

from kernels import cpu_ext

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels are not built")


def _q8_0_blocks(blocks: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (blocks, 34), generator=g, dtype=torch.uint8)
    raw[:, :2] = (torch.rand(blocks, generator=g) * 0.02).half().view(torch.uint8).view(-1, 2)
    return raw


def _q8_0_expected(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The file's codes + 128 (kernel form) and its fp16 scales, as the loader keeps them."""
    return raw[:, 2:] ^ 0x80, raw[:, :2].contiguous().view(torch.float16).reshape(-1)


@pytest.fixture
def two_threads():
    """torch's thread count at 2 for the test (the helpers are that less one), restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def _repack(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    qs = torch.full((raw.shape[0], 32), 0x55, dtype=torch.uint8)  # a piece left out keeps this
    scale = torch.zeros(raw.shape[0], dtype=torch.float16)
    cpu_ext.ops().q8_0_repack(raw, qs, scale)
    return qs, scale


@pytest.mark.parametrize("blocks", [8191, 8193, 65536 + 77, 200_003])  # one piece, two, uneven many
def test_a_matrix_in_many_pieces_is_written_exactly(blocks, two_threads):
    raw = _q8_0_blocks(blocks, blocks)
    for _ in range(3):
        qs, scale = _repack(raw)
        want_qs, want_scale = _q8_0_expected(raw)
        assert torch.equal(qs, want_qs)
        assert torch.equal(scale.view(torch.int16), want_scale.view(torch.int16))


def test_two_loads_at_once_each_get_their_own_bits(two_threads):
    inputs = [_q8_0_blocks(40_000 + 997 * i, i) for i in range(2)]
    wrong: list[str] = []

    def load(raw: torch.Tensor, name: str) -> None:
        want_qs, want_scale = _q8_0_expected(raw)
        for i in range(40):
            qs, scale = _repack(raw)
            if not (torch.equal(qs, want_qs) and torch.equal(scale.view(torch.int16), want_scale.view(torch.int16))):
                wrong.append(f"{name}, call {i}")

    workers = [threading.Thread(target=load, args=(raw, f"load {i}")) for i, raw in enumerate(inputs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers), "a load never finished: its calls wait on each other"
    assert wrong == []


_BACK_TO_BACK = """
import mmap, sys, tempfile, time, torch
from engine.model.packing import move_queue
torch.set_num_threads(8)  # seven helpers on two cores: many wake as each call is offered
blocks = 8193  # two pieces of q8_0_repack (its grain is 8192 blocks): the caller often takes both
raw = torch.randint(0, 256, (blocks * 34,), dtype=torch.uint8)
raw.view(-1, 34)[:, 1] = 0  # finite fp16 scales
with tempfile.TemporaryFile() as f:
    f.write(raw.numpy().tobytes())
    f.flush()
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    view = torch.frombuffer(m, dtype=torch.uint8)
    qs, scale = torch.empty(blocks * 32, dtype=torch.uint8), torch.empty(blocks, dtype=torch.float16)
    start = time.perf_counter()
    while time.perf_counter() - start < float(sys.argv[1]):
        with move_queue.deferring([(view.data_ptr(), len(m))]) as q:  # a load's queue: 2,000 calls in one
            for _ in range(2000):
                move_queue.repack(view, "Q8_0", qs, scale, None)
            q.run()
    del view
    m.close()
print("ok")
"""


def test_calls_back_to_back_never_hand_a_helper_a_call_with_no_piece_left():
    """Calls offered back to back from C++ (a load's queued moves: thousands, none a Python statement apart):
    a helper woken for a call whose last piece the caller takes meanwhile must go back to waiting, never read
    a call that is not there. Seen failing before the fix (the helper searched the calls a second time after
    its wait had found one open, and read past the end of the list): this pattern crashed with a segmentation
    fault in 4 of 13 runs of 3-5 s, and two full test runs crashed in a helper; a race, so the test runs the
    pattern for a few seconds in a child process."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _BACK_TO_BACK, "4"], cwd=root, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])

"""engine.model.packing.move_queue: a load's byte moves out of the mapped file, queued and run in one C++ call.

The oracle is the same load with every move run at once (a queue that holds no file): the packed weights must
be the same bits, for each kind of move (16-row groups of K-quants and IQ4_XS, Q8_0 and Q5_0 repacks, copies
of the embedding's blocks, fused q|k|v and gate|up) and whatever the rows' origin (llama's q/k rows are
unpermuted into a copy first, which runs at once). Releases of the file's pages run after the moves that read
them; progress rises to the queued bytes; a bad move fails with its error and leaves no thread behind.
"""
from __future__ import annotations

import mmap
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from engine.model.gguf.weights import load_gguf
from engine.model.packing import move_queue
from kernels import cpu_ext

pytestmark = pytest.mark.skipif(cpu_ext.ops() is None, reason="the CPU kernels are not built")


def _tensors(x) -> dict[str, torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return {"": x}
    return {k: v for k, v in vars(x).items() if isinstance(v, torch.Tensor)}


def _load(path: Path) -> dict:
    return load_gguf(path, torch.float32, torch.device("cpu"), None, "packed")[1]


@pytest.mark.parametrize("shape,quant,arch,tied", [
    ("tiny-256", "Q4_K_M", "qwen2", False),  # Q4_K / Q6_K groups, fused gate|up, mixed q|k|v, Q4_K embedding rows
    ("tiny-256", "Q4_K_M", "llama", True),  # q/k unpermuted (copies: at once), the embedding as the head
    ("tiny-256", "Q6_K", "qwen2", False),  # fused q|k|v of Q6_K groups
    ("tiny-256", "Q8_0", "qwen2", False),  # Q8_0 -> q8, fused into q|k|v and gate|up
    ("tiny-256", "IQ4_XS", "qwen2", False),
    ("tiny", "Q5_0", "qwen2", False),  # Q5_0 -> q5 (rows of 64: no K-quants)
])
def test_queued_moves_give_the_bits_of_moves_run_at_once(tmp_path, monkeypatch, shape, quant, arch, tied):
    from tools.models.synthetic_gguf import write_random_gguf

    path = write_random_gguf(tmp_path / "m.gguf", shape, 2, quant, arch=arch, tied=tied)
    queued = []
    run = move_queue.MoveQueue.run

    def recording_run(self, *args, **kwargs):
        queued.append(self.nbytes)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(move_queue.MoveQueue, "run", recording_run)
    ours = _load(path)
    assert queued and queued[0] > 0.5 * path.stat().st_size  # most of the file moved through the queue
    deferring = move_queue.deferring

    @contextmanager
    def at_once(spans):
        with deferring([]) as q:
            yield q

    monkeypatch.setattr(move_queue, "deferring", at_once)
    oracle = _load(path)
    assert queued[1] == 0
    assert ours.keys() == oracle.keys()
    for name in ours:
        a, b = _tensors(ours[name]), _tensors(oracle[name])
        assert a.keys() == b.keys(), name
        for part in a:
            assert torch.equal(a[part], b[part]), f"{name}.{part}"


@pytest.fixture
def mapped(tmp_path):
    data = torch.randint(0, 256, (16 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "blob.bin"
    path.write_bytes(data.numpy().tobytes())
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    view = torch.frombuffer(m, dtype=torch.uint8)
    yield data, view, (view.data_ptr(), len(m))
    del view
    m.close()


def _map_rss(address: int) -> int:
    """Resident bytes of the mapping starting at `address` (/proc/self/smaps)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if line[:1] not in "0123456789abcdef" or "-" not in line.split()[0]:
            continue
        if int(line.split("-")[0], 16) == address:
            rss = next(entry for entry in lines[i + 1:] if entry.startswith("Rss:"))
            return int(rss.split()[1]) * 1024
    raise AssertionError(f"no mapping at {address:#x}")


def test_releases_run_after_the_moves_that_read_them(mapped):
    data, view, span = mapped
    half = len(data) // 2
    out = torch.empty(half, dtype=torch.uint8)
    with move_queue.deferring([span]) as q:
        move_queue.copy(view[:half], out)
        assert move_queue.release(span[0], half)  # behind the copy reading it
        assert not move_queue.release(span[0] + half, half)  # no queued move reads it: the caller releases it
        assert not out.any() or not torch.equal(out, data[:half])  # nothing moved yet
        q.run()
    assert torch.equal(out, data[:half])
    assert _map_rss(span[0]) == 0  # the copy faulted the first half in; the queued release dropped it


def test_moves_from_memory_outside_the_file_run_at_once(mapped):
    data, view, span = mapped
    anon = data[:1 << 20].clone()
    out = torch.empty_like(anon)
    with move_queue.deferring([span]) as q:
        move_queue.copy(anon, out)
        assert torch.equal(out, anon) and q.nbytes == 0


def test_progress_rises_to_the_queued_bytes_after_started(mapped, monkeypatch):
    data, view, span = mapped
    monkeypatch.setattr(move_queue, "_POLL", 0.0005)
    events: list = []
    outs = [torch.empty(1 << 20, dtype=torch.uint8) for _ in range(16)]
    with move_queue.deferring([span]) as q:
        for i, out in enumerate(outs):
            move_queue.copy(view[i << 20:(i + 1) << 20], out)
        total = q.nbytes
        q.run(report=events.append, started=lambda: events.append("started"))
    assert events[0] == "started" and events.count("started") == 1
    reports = events[1:]
    assert reports == sorted(reports) and reports[-1] == total == 16 << 20
    assert all(torch.equal(out, data[i << 20:(i + 1) << 20]) for i, out in enumerate(outs))


def test_a_bad_move_fails_with_its_error_and_leaves_no_thread(mapped):
    _, view, span = mapped
    groups = torch.empty(1, 16 * 1000, dtype=torch.uint8)
    with move_queue.deferring([span]) as q:
        move_queue.group(view[:16 * 1000].view(16, 1000), groups, 100)
        with pytest.raises(RuntimeError, match="super-blocks, not 100-byte ones"):
            q.run(report=lambda moved: None)
        assert q.nbytes == 0 and not q.kind  # emptied either way
    assert not [t for t in threading.enumerate() if t.name == "pagedeck-load-progress"]

"""A load's byte moves out of the mapped file, queued while the loader walks the tensors and then run in one C++
call (kernels/cpu/load_moves.cpp) that holds no GIL.

Why: the tokenizer is built on a thread beside the weights, and the tokenizers library holds the GIL for
stretches of up to ~0.1 s while it builds its maps; each of the loader's few hundred returns from a C++
repacker to Python waited for such a stretch, so the two loads took about the sum of their times. With the
moves queued, the loader's Python walk is short and the bytes move while the tokenizer builds.

Inside `deferring(spans)` the repacks, regroupings and copies whose source lies in the mapped file (`spans`:
its address ranges) are queued instead of run, as are the madvise(DONTNEED) releases of the file's pages
(which must follow the moves that read them); anything else (rows copied to be unpermuted, tests, the
safetensors loader) runs at once. `MoveQueue.run` then runs them in order. Destinations must not be read
before it: the loader builds the matrices' objects around still-empty tensors and only reads them later.

A load that starts on the mapped file (engine.model.settle) runs the queue later, in the background: `mark(key)`
closes the moves queued since the last mark as one segment (one tensor's), and `segments()` gives them to run
one by one with `run_segment`, so each finished part of the model can be used as soon as its bytes have moved.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from kernels import cpu_ext
from kernels.packed import group_superblocks

GROUP, Q8_0, Q5, COPY, RELEASE, Q4 = range(6)  # kernels/cpu/load_moves.cpp's kinds
_NONE = torch.empty(0, dtype=torch.uint8)
_POLL = 0.05  # seconds between progress reports while the moves run

_active: ContextVar["MoveQueue | None"] = ContextVar("pagedeck_move_queue", default=None)


class MoveQueue:
    """The moves of one load, in the order the loader asked for them."""

    def __init__(self, spans: list[tuple[int, int]]):
        self.spans = spans  # (address, length) of each mapped file
        self._clear()

    def _clear(self) -> None:
        self.src: list[torch.Tensor] = []
        self.dst: list[torch.Tensor] = []
        self.scale: list[torch.Tensor] = []
        self.minimum: list[torch.Tensor] = []
        self.kind: list[int] = []
        self.arg: list[int] = []
        self.length: list[int] = []
        self.nbytes = 0  # source bytes of the queued moves
        self.last = (0, 0)  # the last queued move's source (address, end)
        self.marks: list[tuple[int, object]] = []  # (moves queued before it, key), in order

    def holds(self, t: torch.Tensor) -> bool:
        """Whether `t` is a contiguous view of a mapped file (its moves can wait: the map outlives the queue)."""
        at, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        return t.is_contiguous() and any(a <= at and end <= a + n for a, n in self.spans)

    def add(self, kind: int, src: torch.Tensor, dst: torch.Tensor = _NONE, scale: torch.Tensor = _NONE,
            minimum: torch.Tensor = _NONE, arg: int = 0, length: int = 0) -> None:
        self.src.append(src)
        self.dst.append(dst)
        self.scale.append(scale)
        self.minimum.append(minimum)
        self.kind.append(kind)
        self.arg.append(arg)
        self.length.append(length)
        if kind != RELEASE:
            self.nbytes += src.numel() * src.element_size()
            self.last = (src.data_ptr(), src.data_ptr() + src.numel() * src.element_size())

    def mark(self, key: object) -> None:
        """Close the moves queued since the last mark as a segment named `key` (run_segment)."""
        self.marks.append((len(self.kind), key))

    def segments(self) -> list[tuple[int, int, object]]:
        """(first move, end, key) of each marked segment, in order, then one for the moves after the last mark
        (key None) where there are some."""
        out, start = [], 0
        for end, key in self.marks:
            out.append((start, end, key))
            start = end
        if start < len(self.kind):
            out.append((start, len(self.kind), None))
        return out

    def run_segment(self, start: int, end: int, solo: bool = False) -> None:
        """Run moves [start, end) in one C++ call (leaving the GIL free); `solo`: on this thread alone. The queue
        keeps its moves (run_segment is for a queue run piece by piece, then dropped)."""
        if end > start:
            cpu_ext.ops().run_moves(self.src[start:end], self.dst[start:end], self.scale[start:end],
                                    self.minimum[start:end], self.kind[start:end], self.arg[start:end],
                                    self.length[start:end], torch.zeros(1, dtype=torch.int64), solo)

    def run(self, report: Callable[[int], None] | None = None, started: Callable[[], None] | None = None) -> None:
        """Run the queued moves in one C++ call; `started()` first (the caller's other work can start: the call
        leaves the GIL free), and report(bytes moved) about every 50 ms from a helper thread, then once at the
        end. Empties the queue."""
        moved = torch.zeros(1, dtype=torch.int64)
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(_POLL):
                report(int(moved[0]))

        poller = threading.Thread(target=poll, name="pagedeck-load-progress", daemon=True) if report else None
        if started is not None:
            started()
        if poller is not None:
            poller.start()
        try:
            if self.kind:
                cpu_ext.ops().run_moves(self.src, self.dst, self.scale, self.minimum, self.kind, self.arg,
                                        self.length, moved)
        finally:
            stop.set()
            if poller is not None:
                poller.join()
            self._clear()
        if report is not None:
            report(int(moved[0]))


@contextmanager
def deferring(spans: list[tuple[int, int]]) -> Iterator[MoveQueue]:
    """Queue the moves out of the mapped files at `spans` (see the module docstring) until the block ends;
    nothing is queued where the C++ kernels are not built (every move then runs at once, in torch)."""
    queue = MoveQueue(spans if cpu_ext.ops() is not None else [])
    token = _active.set(queue)
    try:
        yield queue
    finally:
        _active.reset(token)


def pending() -> int:
    """Source bytes of the active queue's moves (0 where none is active): a load's progress counts them once run."""
    q = _active.get()
    return 0 if q is None else q.nbytes


def mark(key: object) -> None:
    """MoveQueue.mark on the active queue (nothing where none is active)."""
    q = _active.get()
    if q is not None:
        q.mark(key)


def _queue_for(src: torch.Tensor) -> MoveQueue | None:
    q = _active.get()
    return q if q is not None and q.holds(src) else None


def group(rows: torch.Tensor, groups: torch.Tensor, block_bytes: int) -> None:
    """kernels.packed.group_superblocks(rows, groups, block_bytes), queued where rows are in the mapped file."""
    q = _queue_for(rows)
    if q is None:
        group_superblocks(rows, groups, block_bytes)
    else:
        q.add(GROUP, rows, groups, arg=block_bytes)


def repack(raw: torch.Tensor, type_name: str, qs: torch.Tensor, scale: torch.Tensor,
           minimum: torch.Tensor | None) -> None:
    """Q8_0, Q5_0 / Q5_1 or Q4_0 / Q4_1 blocks `raw` (GGUF type `type_name`) repacked into q8's, q5's or q4's
    tensors (kernels/cpu/repack.cpp), queued where raw is in the mapped file."""
    kind = {"Q8_0": Q8_0, "Q5_0": Q5, "Q5_1": Q5, "Q4_0": Q4, "Q4_1": Q4}[type_name]
    second = type_name in ("Q5_1", "Q4_1")  # blocks with their own minimum
    q = _queue_for(raw)
    ops = cpu_ext.ops()
    if q is not None:
        q.add(kind, raw, qs, scale, _NONE if minimum is None else minimum, arg=int(second))
    elif kind == Q8_0:
        ops.q8_0_repack(raw.contiguous(), qs, scale)
    else:
        (ops.q5_repack if kind == Q5 else ops.q4_repack)(raw.contiguous(), qs, scale, minimum, second)


def copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[...] = src (same bytes), queued where src is in the mapped file and dst is contiguous."""
    q = _queue_for(src)
    if q is not None and dst.is_contiguous() and dst.dtype == src.dtype and dst.shape == src.shape:
        q.add(COPY, src, dst)
    else:
        dst.copy_(src)


def release(address: int, length: int) -> bool:
    """Queue madvise(DONTNEED) of the page-aligned range of a mapped file behind the moves queued so far, where
    the last queued move reads from it; False otherwise (no queue, or the range was read by moves that ran at
    once: the caller releases it now, so the file is not held resident until the queue runs)."""
    q = _active.get()
    if q is None or not (address < q.last[1] and q.last[0] < address + length):
        return False
    q.add(RELEASE, _NONE, arg=address, length=length)
    return True

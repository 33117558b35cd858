"""A loaded model's weights settling into their kernel layouts in the background, after it has started on the mapped
file.

Copying every weight of a GGUF out of the mapped file into the kernels' layouts (16-row groups, q|k|v and gate|up
fused: engine.model.packing) takes ~0.45 s of a 1.3 GB Q6_K file on two cores, page faults mostly, where llama.cpp
maps the file and is ready in ~0.3 s. So where every packed matrix is in a format the kernels also read as the
file stores it (the K-quants and IQ4 types; Q8_0 and Q5_0 through the start-only formats q8s and q5s, which give
q8's and q5's bits: rows of the file's blocks), the load does not wait for it: the model starts on views of the
mapped file (each matrix's rows; q|k|v and gate|up as parts, qlinear.PartsLinear), and a thread here then runs the
load's queued moves (engine.model.packing.move_queue), one tensor at a time, on its own core share and at the
lowest CPU priority so that a decode step beside it keeps its pace. Each tensor's file pages are let go with its
moves (madvise DONTNEED: they stay in the page cache, the process stops holding them; a step meanwhile reads
them back), so the file and its settled copy are never both resident beyond a tensor; as soon as all of a
layer's tensors have moved the model takes that layer's settled weights (Model.adopt) and what steps read of the
old ones meanwhile is let go again. Last the all-layers decode stack is rebuilt over the settled layers and their
buffers go onto 2 MB pages (engine.model.huge_pages).

A step that runs meanwhile reads each layer as it finds it: the row kernels and the grouped ones give the same
bits, and so do parts and the fused matrix (rows are independent), so nothing a user sees depends on when the
weights settle, only how fast the first steps are (~10 % slower on a Q6_K file: the file's rows instead of 16-row
groups; the all-layers decode call takes the parts, its stack rebuilt as each layer is handed over). The model
is held weakly: one dropped meanwhile (a reload) stops the work and is freed. At exit the work stops after the
tensor in hand (a daemon thread woken inside a C++ call while the interpreter finalizes aborts the process).
"""
from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Protocol

import torch

from . import huge_pages
from .heap import release_freed_memory
from .gguf.weights import Unmoved
from .loader import ModelWeights

log = logging.getLogger(__name__)


class Model(Protocol):
    """What settling needs of engine.model.model.Model (which imports this module)."""

    def adopt(self, part: int | str, weights: ModelWeights) -> None: ...
    def settled(self, adopted: bool = True) -> None: ...
    def weight_storages(self) -> list[torch.UntypedStorage]: ...


@dataclass
class Settling:
    """What a model started on its mapped file still has to take: its settled weights (built around tensors the
    queued moves fill) and the load's unmoved bytes."""
    weights: ModelWeights
    unmoved: Unmoved


_exiting = threading.Event()
_threads: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


@atexit.register
def _stop_at_exit() -> None:
    _exiting.set()
    for th in list(_threads):
        th.join(timeout=10)


def in_background(model: Model, settling: Settling | None) -> threading.Thread | None:
    """Start settling the model's weights (where it started on the mapped file) and then moving them onto 2 MB
    pages, on a daemon thread; None where there is nothing to do."""
    if settling is None and not huge_pages.wanted(model.weight_storages()):
        return None
    ref, held = weakref.ref(model), [settling]  # held: the thread's only reference to `settling`, dropped by
    # _settle once the model has adopted its layers (the thread's arguments would keep it to the end)

    def run() -> None:
        _settle(ref, held)

    th = threading.Thread(target=run, name="pagedeck-settle", daemon=True)
    _threads.add(th)
    th.start()
    return th


def _settle(ref: "weakref.ref[Model]", held: list) -> None:
    huge_pages.lowest_priority()
    settling: Settling | None = held.pop()
    if settling is not None:
        adopted = False
        try:
            adopted = _move(ref, settling)
        except Exception:  # the model keeps running on the mapped file: slower, the same results
            log.exception("the weights could not settle; the model stays on the mapped file")
        finally:
            model = ref()
            if model is not None:
                model.settled(adopted)
            del model
            # the file's pages go; the map itself goes with the last view of it (a step may still be reading
            # the layers it started with: closing it here would pull the pages from under that step)
            settling.unmoved.gguf.release()
            settling = None  # the layouts the model started on, and those replaced while settling, go now
            release_freed_memory()  # (q5 rows before their groups, ...): their heap back to the OS
        if not adopted:
            return
    model = ref()
    if model is None:
        return
    storages = model.weight_storages()
    del model  # collapsing never needs the model: a reload meanwhile frees it
    if huge_pages.enabled():
        huge_pages.collapse(huge_pages.aligned_ranges(storages))


def _move(ref: "weakref.ref[Model]", settling: Settling) -> bool:
    """Run the moves tensor by tensor, handing the model each layer (and the embedding, head and norm) once its
    tensors have all moved; False where the model was dropped on the way (or the process is exiting)."""
    u = settling.unmoved
    segments = u.moves.segments()  # each marked with (the part it belongs to, its GGUF tensor's name)
    left = Counter(mark[0] for *_, mark in segments if mark is not None)
    moved: dict[object, list[str]] = defaultdict(list)
    for start, end, mark in segments:
        if ref() is None or _exiting.is_set():
            return False
        u.moves.run_segment(start, end, solo=True)
        if mark is None:
            continue
        part, name = mark
        moved[part].append(name)
        left[part] -= 1
        if left[part] == 0:
            model = ref()
            if model is None:
                return False
            model.adopt(part, settling.weights)
            del model
            for name in moved.pop(part):
                u.gguf.release(name)
    return True

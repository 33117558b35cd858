"""Which experts a mixture-of-experts model's rows chose over the generator's last N steps, per sparse layer and
per job: the dashboard's expert map (metrics' `experts`; None for a dense model).

Each MoEBlock.route hands its (rows, k) expert choices to the block's `observe` hook (engine.model.moe). The
model's RouterTap sends them to the ExpertStats stepping on the calling thread (two generators sharing one
model never see each other's rows) and to nothing outside a generator's forward. At the step's end one
bincount over every sparse layer's choices, indexed (layer, job, expert), gives the step's counts; the row ->
job mapping comes from the step's plan, one entry per scheduled sequence (no Python loop over rows).

Counting costs a step ~0.4 ms (the stack and bincount), so it runs only while someone watches: the expert map
reads metrics() (whose `experts` is snapshot()) a few times a second from the dashboard's timer, and each
snapshot renews a lease of WATCH_S seconds or `window` steps, whichever lasts longer; a generator also counts
its first `window` steps. Outside a lease a step only looks at the clock (its routes are not even kept), and
the first snapshot after such a lapse starts the window afresh, so the map never mixes steps from before the
lapse with those after it.

The counts are kept in a ring of the last `window` steps with running totals (a step in: its counts added; a
step out: subtracted), so a snapshot copies totals and never sums the ring. A step's counts hold only the jobs
it ran. A job that ended keeps its counts until its last step leaves the ring; an idle generator keeps the
last picture.

Bytes: a step reads each sparse layer's router and, once, every expert any of its rows chose; per token that
is the step's expert bytes over its rows (`read_bytes_per_token`, over the window). A single row reads top_k of
E experts (`top_k_bytes_per_token`, MoEBlock.decode_bytes' figure); a dense model of the same size reads every
expert of every layer (`dense_bytes_per_token`).
"""
from __future__ import annotations

import contextlib
import threading
import time
import weakref
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch

from ..model.moe import _nbytes

if TYPE_CHECKING:
    from ..model.model import Model
    from .sequence import ScheduledSeq

DEFAULT_WINDOW = 64  # steps: a few seconds of decoding
WATCH_S = 2.0  # seconds a snapshot keeps the counting on (the dashboard reads ~10 times a second)


class RouterTap:
    """A model's hook on its MoE blocks: hands each sparse layer's choices to the stats stepping on this thread."""

    _taps: "weakref.WeakKeyDictionary[Model, RouterTap]" = weakref.WeakKeyDictionary()

    def __init__(self, blocks: list) -> None:
        self._local = threading.local()
        for i, block in enumerate(blocks):
            block.observe = partial(self._record, i)

    @classmethod
    def of(cls, model: "Model") -> "RouterTap":
        """The model's one tap (made on first use: every generator on the model shares it)."""
        tap = cls._taps.get(model)
        if tap is None:
            tap = cls._taps[model] = cls([layer.moe for layer in model.layers if layer.moe is not None])
        return tap

    def _record(self, i: int, experts: torch.Tensor) -> None:
        choices = getattr(self._local, "choices", None)
        if choices is not None:
            choices[i] = experts

    @contextlib.contextmanager
    def collecting(self, n_layers: int) -> Iterator[list]:
        """Within the block, this thread's routes land in the yielded list (one slot per sparse layer)."""
        choices: list = [None] * n_layers
        self._local.choices = choices
        try:
            yield choices
        finally:
            self._local.choices = None


@dataclass
class _Step:
    serials: list[int]  # the jobs of this step, in the counts' job order
    counts: np.ndarray  # (layers, jobs, experts) rows per expert
    read_bytes: int  # routers plus every expert any row chose, once each
    rows: int


class ExpertStats:
    """Expert counts over the last `window` steps of one generator's MoE model; `of` gives a disabled one for a
    dense model (its step() does nothing, its snapshot is None)."""

    def __init__(self, model: "Model | None", window: int = DEFAULT_WINDOW) -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"the expert map's window must be a positive number of steps, got {window!r}")
        layers = [] if model is None else model.layers
        blocks = [(i, layer.moe) for i, layer in enumerate(layers) if layer.moe is not None]
        self.window = window
        self.enabled = bool(blocks)
        self.layers = [i for i, _ in blocks]
        self.tap = RouterTap.of(model) if blocks else None
        self.num_experts = len(blocks[0][1].gate_up) if blocks else 0
        self.top_k = blocks[0][1].top_k if blocks else 0
        # per layer and expert: bytes a step reads of it ([gate | up] and down); per layer: the router
        self.expert_bytes = np.array([_expert_bytes(b) for _, b in blocks], np.int64).reshape(len(blocks), self.num_experts)
        self.router_bytes = int(sum(_nbytes(b.router) + _bias_bytes(b, "router_bias") for _, b in blocks))
        self.top_k_bytes = int(sum(b.decode_bytes() for _, b in blocks))
        self.dense_bytes = self.router_bytes + int(self.expert_bytes.sum())
        self._lock = threading.Lock()  # snapshot() runs on the dashboard's thread, step() on the generator's
        self._read_at = -float("inf")  # when the last snapshot was taken (time.monotonic)
        self._unread_steps = 0  # steps since then (the generator's first steps count: see watched)
        self._lapsed = False  # some step went uncounted since the last snapshot
        self._clear()

    @classmethod
    def of(cls, model: "Model", window: int = DEFAULT_WINDOW) -> "ExpertStats":
        return cls(model if any(layer.moe is not None for layer in model.layers) else None, window)

    def _clear(self) -> None:
        self._ring: list[_Step | None] = [None] * self.window
        self._head = 0
        self.steps_total = 0  # steps counted since the generator started (the window holds the last ones)
        self._layer_totals = np.zeros((len(self.layers), self.num_experts), np.int64)
        self._job_totals: dict[int, np.ndarray] = {}
        self._job_steps: dict[int, int] = {}  # serial -> steps of the ring it ran in
        self._identifiers: dict[int, Any] = {}
        self._read_bytes = self._rows = 0

    def reset(self) -> None:
        with self._lock:
            self._clear()

    # ---- the generator's step ---------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, plan: "list[ScheduledSeq]") -> Iterator[None]:
        """Around the step's forward: count the experts its rows chose (plan: the scheduled sequences in the
        batch's row order). A forward that raises counts nothing."""
        if not self.enabled:
            yield
            return
        self._unread_steps += 1
        if not self.watched:
            self._lapsed = True
            yield
            return
        with self.tap.collecting(len(self.layers)) as choices:
            yield
        if any(c is None for c in choices):  # a forward that skipped a sparse layer: nothing to attribute
            return
        self._count(plan, choices)

    @property
    def watched(self) -> bool:
        """Whether a snapshot was taken in the last WATCH_S seconds or `window` steps: steps are counted."""
        return self._unread_steps <= self.window or time.monotonic() - self._read_at < WATCH_S

    def _count(self, plan: "list[ScheduledSeq]", choices: list[torch.Tensor]) -> None:
        jobs: dict[int, int] = {}
        identifiers: dict[int, Any] = {}
        for e in plan:
            jobs.setdefault(e.job.serial, len(jobs))
            identifiers[e.job.serial] = e.job.identifier
        device = choices[0].device
        lengths = torch.tensor([len(e.tokens) for e in plan])
        job_of_row = torch.repeat_interleave(torch.tensor([jobs[e.job.serial] for e in plan]), lengths).to(device)
        L, J, E = len(self.layers), len(jobs), self.num_experts
        stacked = torch.stack(choices)  # (layers, rows, k)
        index = (torch.arange(L, device=device).view(L, 1, 1) * J + job_of_row.view(1, -1, 1)) * E + stacked
        counts = torch.bincount(index.reshape(-1), minlength=L * J * E).view(L, J, E).to(torch.int32).cpu().numpy()
        per_layer = counts.sum(axis=1)
        step = _Step(list(jobs), counts, self.router_bytes + int(self.expert_bytes[per_layer > 0].sum()),
                     int(lengths.sum()))
        with self._lock:
            old = self._ring[self._head]
            if old is not None:
                self._drop(old)
            self._ring[self._head] = step
            self._head = (self._head + 1) % self.window
            self.steps_total += 1
            self._layer_totals += per_layer
            for j, serial in enumerate(step.serials):
                total = self._job_totals.get(serial)
                if total is None:
                    self._job_totals[serial] = counts[:, j].astype(np.int64)
                else:
                    total += counts[:, j]
                self._job_steps[serial] = self._job_steps.get(serial, 0) + 1
            self._identifiers.update(identifiers)
            self._read_bytes += step.read_bytes
            self._rows += step.rows

    def _drop(self, step: _Step) -> None:
        """Take a step that leaves the ring out of the totals (a job none of the ring's steps ran is forgotten)."""
        self._layer_totals -= step.counts.sum(axis=1)
        for j, serial in enumerate(step.serials):
            self._job_steps[serial] -= 1
            if self._job_steps[serial] == 0:
                del self._job_steps[serial], self._job_totals[serial], self._identifiers[serial]
            else:
                self._job_totals[serial] -= step.counts[:, j]
        self._read_bytes -= step.read_bytes
        self._rows -= step.rows

    # ---- the dashboard's view ---------------------------------------------------------------------
    def snapshot(self) -> dict | None:
        """Plain values (numpy arrays, ints, dicts) for metrics()' `experts`; None for a dense model.

        layers: the model's index of each sparse layer (the rows of `counts`); counts: (layers, experts) rows
        each expert took over the last `steps` steps (at most `window`); jobs: serial -> that job's own
        (layers, experts) counts; identifiers: serial -> the job's identifier; rows: the window's rows (each
        row chose top_k experts in every sparse layer); *_bytes_per_token: see the module docstring."""
        if not self.enabled:
            return None
        with self._lock:
            self._read_at, self._unread_steps = time.monotonic(), 0
            if self._lapsed:  # steps went uncounted: the window starts again from here
                self._clear()
                self._lapsed = False
            steps = min(self.steps_total, self.window)
            return {
                "layers": list(self.layers), "num_experts": self.num_experts, "top_k": self.top_k,
                "window": self.window, "steps": steps, "steps_total": self.steps_total, "rows": self._rows,
                "counts": self._layer_totals.copy(),
                "jobs": {s: t.copy() for s, t in self._job_totals.items()},
                "identifiers": dict(self._identifiers),
                "read_bytes_per_token": self._read_bytes / self._rows if self._rows else None,
                "top_k_bytes_per_token": self.top_k_bytes, "dense_bytes_per_token": self.dense_bytes,
            }


def _bias_bytes(block, name: str, e: int | None = None) -> int:
    """Bytes of a block's bias (all of it, or expert e's) where the architecture has one (gpt-oss)."""
    bias = getattr(block, name, None)
    if bias is not None and e is not None:
        bias = bias[e]
    return 0 if bias is None else _nbytes(bias)


def _expert_bytes(block) -> list[int]:
    """Per expert: the bytes a step that runs it reads ([gate | up], down and their biases)."""
    return [_nbytes(g) + _nbytes(d) + _bias_bytes(block, "gate_up_bias", e) + _bias_bytes(block, "down_bias", e)
            for e, (g, d) in enumerate(zip(block.gate_up, block.down))]

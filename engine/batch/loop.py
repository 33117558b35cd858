"""The batch scheduler: keeps up to `concurrency` rows in flight as jobs, reports each as it finishes.

It knows nothing of where a job runs: `start(row)` is an async generator of the job's results (engine
result dicts) that lets its job go when closed early (a pause closes it), so the CLI runs it over a
DynamicGeneratorAsync and the app over its chats' Backend. The generator batches whatever is in flight;
enqueueing every row at once would gain nothing past its batch size and make a pause cancel thousands.
A row that fails (a prompt too long for the context: ValueError) is reported with its error; the others
go on. A failure of the engine itself (its job cancelled from outside, the generator closed or not
loaded: RuntimeError) pauses the run instead, leaving the row to do, so closing the model never records
rows as failed; `stopped_by` says why.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterable

from .inputs import BatchRow


@dataclass
class RowResult:
    """One finished row: its reply, or the error that stopped it."""

    text: str = ""
    eos_reason: str | None = None
    new_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None

    def as_dict(self) -> dict:
        return {"output": self.text, "eos_reason": self.eos_reason, "new_tokens": self.new_tokens,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens, "error": self.error}


class BatchLoop:
    """Run rows through `start`; `finished(row, result)` is called once per row that ends (not for rows
    cut off by pause(), which stay to do)."""

    def __init__(self, start: Callable[[BatchRow], AsyncIterator[dict]],
                 finished: Callable[[BatchRow, RowResult], None], concurrency: int = 32):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.start, self.finished = start, finished
        self.concurrency = concurrency
        self._paused = asyncio.Event()
        self.running = False
        self.stopped_by: str | None = None  # why the engine stopped the run (None: finished or paused)

    def pause(self) -> None:
        """Stop starting rows and cut off the running ones; run() returns False once they are let go."""
        self._paused.set()

    async def run(self, rows: Iterable[BatchRow]) -> bool:
        """Run every row; True when all finished, False when paused first."""
        self._paused.clear()
        self.stopped_by = None
        self.running = True
        todo = list(rows)
        in_flight: dict[asyncio.Task, BatchRow] = {}
        pause = asyncio.ensure_future(self._paused.wait())
        try:
            while todo or in_flight:
                while todo and len(in_flight) < self.concurrency and not self._paused.is_set():
                    row = todo.pop(0)
                    in_flight[asyncio.ensure_future(self._one(row))] = row
                if self._paused.is_set():
                    break
                done, _ = await asyncio.wait([*in_flight, pause], return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    row = in_flight.pop(task, None)
                    if row is None:
                        continue
                    if task.result() is None:  # the engine stopped: the row stays to do
                        todo.insert(0, row)
                    else:
                        self.finished(row, task.result())
            return not todo and not in_flight
        finally:
            pause.cancel()
            for task in in_flight:
                task.cancel()
            for task, row in in_flight.items():
                try:
                    result = await task
                except asyncio.CancelledError:
                    continue  # cut off: still to do
                if result is not None:
                    self.finished(row, result)  # it ended just before the pause: keep it
            self.running = False

    async def _one(self, row: BatchRow) -> RowResult | None:
        """The row's result, or None when the engine stopped it (the run is paused then)."""
        out = RowResult()
        try:
            async with contextlib.aclosing(self.start(row)) as results:
                async for r in results:
                    _take(out, r)
        except ValueError as exc:  # this row's problem: reported with the row
            out.error = f"{type(exc).__name__}: {exc}"
        except RuntimeError as exc:  # the engine's (closed, not loaded): stop here, nothing recorded
            return self._engine_stopped(f"{exc}")
        if out.eos_reason == "cancelled" or out.eos_reason is None:
            return self._engine_stopped("the engine cancelled the job (model unloaded or closing)")
        return out

    def _engine_stopped(self, why: str) -> None:
        if self.stopped_by is None:
            self.stopped_by = why
        self._paused.set()
        return None


def _take(out: RowResult, r: dict) -> None:
    """Fold one engine result into the row's result."""
    if r.get("stage") == "started":
        out.cached_tokens = int(r.get("cached_tokens") or 0)
        out.prompt_tokens = int(r.get("prompt_tokens") or 0)
    if r.get("stage") != "streaming":
        return
    out.text += r.get("text", "")
    if r.get("eos"):
        out.eos_reason = r.get("eos_reason")
        out.new_tokens = int(r.get("new_tokens") or 0)
        out.prompt_tokens = int(r.get("prompt_tokens") or out.prompt_tokens)

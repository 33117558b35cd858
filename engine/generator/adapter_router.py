"""AdapterRouter: makes every new job run with the LoRA set it asked for, while the generator has one.

Today the generator applies one LoRA set to every job and swaps it only while idle (ExLlamaV2's rule, see
DynamicGeneratorAsync.set_loras). Chats and API requests may want different sets, so nobody calls
set_loras directly: they all ask the router, and `acquire(wanted)` returns at a moment when a job created
right away (no await in between) runs with exactly `wanted`: the generator has that set and no swap is
pending. Otherwise the router asks for a swap (it happens once the running jobs finish) and every new
request waits for it, also those for the set in use, so a request for another set waits at most for the
jobs already admitted (no starvation) and a failed swap fails the requests that wanted it instead of
running them on the wrong adapter.

When jobs carry their own adapters (per-job LoRA), `acquire` becomes a no-op and the job names its
adapter: this class is the one place to change.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterable

# One adapter as the router sees it: a folder path or an engine.LoRA, with its scale.
AdapterSet = tuple[tuple[Any, float], ...]


def adapter_key(adapters: Iterable[tuple[Any, float]] | None) -> tuple:
    """Comparable identity of an adapter set: resolved folder (or LoRA content hash) and scale per adapter."""
    key = []
    for item, scale in adapters or ():
        path = getattr(item, "path", item)
        ident = str(Path(path).resolve()) if isinstance(path, (str, Path)) else getattr(item, "content_hash", id(item))
        key.append((ident, float(scale)))
    return tuple(key)


class AdapterRouter:
    """The only caller of `generator.set_loras` (a DynamicGeneratorAsync) once it exists."""

    def __init__(self, generator: Any):
        self.generator = generator
        self._target: AdapterSet = ()  # what a job created now runs with (swap pending included)
        self._swapping: asyncio.Future | None = None
        self.waiting = 0  # requests waiting here for a swap (reported as waiting in metrics)

    @property
    def target(self) -> AdapterSet:
        return self._target

    @property
    def target_names(self) -> list[str]:
        return [Path(str(getattr(a, "path", a))).name for a, _ in self._target]

    @property
    def swapping(self) -> bool:
        return self._swapping is not None

    def ready_for(self, wanted: Iterable[tuple[Any, float]] | None) -> bool:
        """A job created now would run with `wanted` (acquire would return at once)."""
        return self._swapping is None and adapter_key(self._target) == adapter_key(wanted)

    async def acquire(self, wanted: Iterable[tuple[Any, float]] | None) -> None:
        """Return when a job created at once runs with `wanted` ([(adapter, scale)], None = no adapter).

        Raises the swap's exception when the generator could not apply `wanted`.
        """
        wanted = tuple(wanted or ())
        self.waiting += 1
        try:
            while not self.ready_for(wanted):
                if self._swapping is None:
                    self._start_swap(wanted)
                    await asyncio.shield(self._swapping)  # raises if our swap failed
                else:
                    await asyncio.wait([self._swapping])  # someone else's swap: its failure is theirs
        finally:
            self.waiting -= 1

    async def swap(self, wanted: Iterable[tuple[Any, float]] | None) -> None:
        """Swap to `wanted` even if it is the set in use (re-reads adapter folders); returns once swapped."""
        wanted = tuple(wanted or ())
        while self._swapping is not None:
            await asyncio.wait([self._swapping])
        self._start_swap(wanted)
        await asyncio.shield(self._swapping)

    def _start_swap(self, wanted: AdapterSet) -> None:
        """Ask the generator for `wanted` (applied once it is idle); `_swapping` resolves when it is done."""
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        self._swapping = finished
        previous, self._target = self._target, wanted
        scales = [s for _, s in wanted]
        task = loop.create_task(self.generator.set_loras([a for a, _ in wanted] or None, scales or None))

        def settle(t: asyncio.Task) -> None:
            self._swapping = None
            exc = asyncio.CancelledError() if t.cancelled() else t.exception()
            if exc is not None:
                self._target = previous  # set_loras' contract: on failure the old set stays
                finished.set_exception(exc)
                finished.exception()  # marked retrieved: the caller of acquire/swap reports it
            else:
                finished.set_result(None)

        task.add_done_callback(settle)

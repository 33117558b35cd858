"""Background coroutines started from Qt slots: their failures are logged and shown, never lost.

A failure is also handed to every watcher registered with `watch_failures` (none in the app): the test suite
watches, so that a test during which a background task raised fails, rather than passing on a warning in
the log that nobody reads.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger(__name__)
_watchers: list[Callable[[asyncio.Task, BaseException], None]] = []


def watch_failures(watcher: Callable[[asyncio.Task, BaseException], None]) -> Callable[[], None]:
    """Call `watcher(task, exception)` for each spawned task that fails from now on; returns the call that
    stops watching."""
    _watchers.append(watcher)
    return lambda: _watchers.remove(watcher)


def spawn(coro, on_error: Callable[[str], None] | None = None) -> asyncio.Task:
    """Run a coroutine from a Qt slot; its exception is logged and shown, never lost in the loop."""
    task = asyncio.ensure_future(coro)

    def done(t: asyncio.Task) -> None:
        if not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            log.warning("background task failed: %s", exc)
            for watcher in list(_watchers):
                watcher(t, exc)
            if on_error is not None:
                on_error(f"{type(exc).__name__}: {exc}")

    task.add_done_callback(done)
    return task

"""Background coroutines started from Qt slots: their failures are logged and shown, never lost."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger(__name__)


def spawn(coro, on_error: Callable[[str], None] | None = None) -> asyncio.Task:
    """Run a coroutine from a Qt slot; its exception is logged and shown, never lost in the loop."""
    task = asyncio.ensure_future(coro)

    def done(t: asyncio.Task) -> None:
        if not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            log.warning("background task failed: %s", exc)
            if on_error is not None:
                on_error(f"{type(exc).__name__}: {exc}")

    task.add_done_callback(done)
    return task

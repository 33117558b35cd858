"""N replies at once: the other N-1 versions of a reply, run beside the chat's own (streamed) one.

"N replies" answers the last user message N times in one batch: the chat's own reply machinery streams
version 1, and this runs versions 2..N as jobs of their own on the same prompt (the generator prefills
that prompt once and shares its pages). Each is a sibling in the store's message tree, so the pane's
version browser shows them as ‹ 1/N ›; each is stored when it ends (a killed app keeps the finished
ones). Version i is seeded seed + i - 1 when the chat has a seed, so the versions differ (unless greedy,
where they equal the single reply).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from app.core.store import Message, ReplyStats

log = logging.getLogger(__name__)

MAX_REPLIES = 8


def check_count(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_REPLIES:
        raise ValueError(f"N replies takes 2 to {MAX_REPLIES} replies, got {n!r}")
    return n


class ExtraReplies:
    """Versions 2..N of a chat's reply. `session` is the ChatSession (its store, backend, clock, context
    fitting and signals); `tracker_cls` folds a job's results into text and stats (ReplyTracker)."""

    def __init__(self, session: Any, tracker_cls: type):
        self.session = session
        self.tracker_cls = tracker_cls
        self.tasks: dict[int, asyncio.Task] = {}  # reply message id -> its task

    @property
    def running(self) -> bool:
        return any(not t.done() for t in self.tasks.values())

    def start(self, primary: Message, n: int) -> list[Message]:
        """Add versions 2..n of `primary` (the reply just started, still shown) and run them."""
        s = self.session
        replies = [s.store.add_message(s.chat_id, "assistant", "", ReplyStats(state="queued"),
                                       parent_id=primary.parent_id) for _ in range(n - 1)]
        s.store.select(s.chat_id, primary.id)  # the chat keeps showing version 1 (adding moved its head)
        history = [{"role": m.role, "content": m.content} for m in s.messages[:-1]]
        for i, reply in enumerate(replies, 1):
            self.tasks[reply.id] = asyncio.get_running_loop().create_task(self._run(reply, i, history))
        return replies

    async def stop(self) -> None:
        """Cancel every version still running and wait until each is recorded."""
        tasks = [t for t in self.tasks.values() if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _identifier(self, i: int) -> tuple:
        return (self.session.chat_id, i)

    async def _run(self, reply: Message, i: int, history: list[dict]) -> None:
        s = self.session
        tracker = self.tracker_cls(s.clock())
        started = False
        try:
            await s.backend.wait_loaded()
            fitted, settings = s._fit(history, tracker, {})  # alternatives run without tools
            if settings.seed is not None:
                settings = replace(settings, seed=settings.seed + i)
            job, tracker.stats.prompt_tokens = s.backend.start_job(self._identifier(i), fitted, settings)
            started = True
            async for r in job:
                tracker.feed(r, s.clock())
            if tracker.stats.state not in ("done", "stopped", "error"):
                tracker.stats.state = "stopped"
        except asyncio.CancelledError:
            if started:
                await s.backend.cancel(self._identifier(i))
            tracker.stats.state = "stopped"
            raise
        except Exception as exc:  # noqa: BLE001 - shown under that version, never raised into the loop
            log.warning("chat %s reply version %s failed: %s", s.chat_id, i + 1, exc)
            tracker.fail(exc)
        finally:
            if started:
                s.backend.job_ended(self._identifier(i))
            try:
                s.store.update_reply(reply.id, tracker.text, replace(tracker.stats))
            except KeyError:  # the chat was deleted meanwhile
                pass
            self.tasks.pop(reply.id, None)
            s.reply_finished.emit(reply.id)

"""One chat's conversation and its (at most one) running reply: job results -> text, stats, storage.

Timing comes from token events: the moment each streaming result carrying tokens reaches this
coroutine, never from repaints. The partial reply is written to the store at most SAVE_INTERVAL_S
after it changed (a timer, so a stalled stream is still saved), so a killed process loses at most
about that much of one reply and nothing already completed.

The conversation is the store's message tree seen as one path: regenerate and edit add a sibling (the
old version stays, reachable with select_alternative), continue_reply extends a stopped reply in place,
and branch copies the path up to a message into a new chat.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from typing import Callable

from PySide6.QtCore import QObject, Signal

from app.chat.alternatives import ExtraReplies, check_count
from app.core.backend import Backend
from app.core.context import ContextFull, fit_context
from app.core.store import RUNNING_STATES, ChatSettings, Message, ReplyStats, Store

log = logging.getLogger(__name__)

SAVE_INTERVAL_S = 0.5
# A reply that ended before it was complete: Continue picks it up where it stopped.
CONTINUABLE_STATES = ("stopped", "interrupted")


class ReplyTracker:
    """Folds one job's results into reply text and ReplyStats."""

    def __init__(self, sent_at: float, prompt_tokens: int | None = None, text: str = "", new_tokens: int = 0):
        self.sent_at = sent_at
        self.text = text  # a continued reply starts with what it already had
        self.stats = ReplyStats(state="queued", prompt_tokens=prompt_tokens, new_tokens=new_tokens)
        self._base_tokens = new_tokens
        self._first_at: float | None = None
        self._first_n = 0

    def feed(self, r: dict, now: float) -> None:
        stage = r.get("stage")
        s = self.stats
        if stage == "deferred":
            s.state = "deferred"
        elif stage == "started":
            s.state, s.progress = "prefill", 0.0
            if r.get("cached_tokens") is not None:
                s.cached_tokens = r["cached_tokens"]
            if r.get("loras") is not None:  # the adapters and scales this reply runs with
                s.adapters = json.dumps([[name, scale] for name, scale in r["loras"]])
        elif stage == "prefill":
            s.state = "prefill"
            s.progress = r["curr_progress"] / max(1, r["max_progress"])
        elif stage == "streaming":
            self.text += r.get("text", "")
            n = r.get("num_tokens", len(r.get("token_ids") or ()))  # remote streams count, not list, tokens
            if n:
                if self._first_at is None:
                    self._first_at, self._first_n = now, self._base_tokens + n
                    s.ttft_s = now - self.sent_at
                s.new_tokens += n
                if now > self._first_at and s.new_tokens > self._first_n:
                    s.tokens_per_s = (s.new_tokens - self._first_n) / (now - self._first_at)
            s.state = "streaming"
            if r.get("eos"):
                self._finish(r)

    def _finish(self, r: dict) -> None:
        s = self.stats
        s.eos_reason = r.get("eos_reason")
        s.state = "stopped" if s.eos_reason == "cancelled" else "done"
        for key in ("prompt_tokens", "cached_tokens"):
            if r.get(key) is not None:
                setattr(s, key, r[key])
        if r.get("new_tokens") is not None:
            s.new_tokens = self._base_tokens + r["new_tokens"]

    def fail(self, exc: BaseException) -> None:
        self.stats.state = "error"
        self.stats.error = str(exc) if isinstance(exc, ContextFull) else f"{type(exc).__name__}: {exc}"


class ChatSession(QObject):
    """The model of one chat pane: history from the store, one reply at a time through its backend."""

    history_changed = Signal()  # messages added/removed: views rebuild
    renamed = Signal(str)
    settings_changed = Signal()
    reply_changed = Signal(int)  # message id of the reply whose text/stats changed
    reply_finished = Signal(int)
    activity_changed = Signal(str)  # the running reply's state (queued/deferred/prefill/streaming), "" when idle

    def __init__(self, store: Store, chat_id: int, backend: Backend, parent: QObject | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        super().__init__(parent)
        self.store = store
        self.chat_id = chat_id
        self.backend = backend
        self.clock = clock
        self.chat = store.chat(chat_id)
        self.messages: list[Message] = store.messages(chat_id)
        self.task: asyncio.Task | None = None
        self._tracker: ReplyTracker | None = None
        self._reply: Message | None = None
        self._save_handle: asyncio.TimerHandle | None = None
        self._stopping = 0  # stops in progress: the reply counts as running until the backend has let go
        self._activity = ""
        self.extras = ExtraReplies(self, ReplyTracker)  # versions 2..N of an "N replies" request

    # --- queries -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """A reply is under way: from send until its end is recorded, and while a stop waits for the backend."""
        return self._stopping > 0 or self._reply is not None or self.extras.running

    @property
    def activity(self) -> str:
        return self._activity

    def can_continue(self) -> bool:
        """The last reply ended early (stopped, interrupted, or cut at its token limit) and can be extended."""
        last = self.messages[-1] if self.messages else None
        return (self.backend.continues_replies and not self.running and last is not None and last.role == "assistant" and last.stats is not None
                and (last.stats.state in CONTINUABLE_STATES
                     or (last.stats.state == "done" and last.stats.eos_reason == "max_new_tokens")))

    def alternatives(self, message_id: int) -> list[int]:
        """The versions of a message (regenerated replies, edited messages), oldest first."""
        return self.store.alternatives(message_id)

    @property
    def settings(self) -> ChatSettings:
        return self.chat.settings

    def live(self, message_id: int) -> tuple[str, ReplyStats] | None:
        """Current text and stats of the streaming reply (ahead of the stored copy)."""
        if self._reply is not None and self._reply.id == message_id:
            return self._tracker.text, self._tracker.stats
        return None

    # --- commands ------------------------------------------------------------------------------

    def set_settings(self, settings: ChatSettings) -> None:
        self.store.set_settings(self.chat_id, settings.validate())
        self.chat = self.store.chat(self.chat_id)
        self.settings_changed.emit()

    def rename(self, title: str) -> None:
        self.store.rename_chat(self.chat_id, title)
        self.chat = self.store.chat(self.chat_id)
        self.renamed.emit(self.chat.title)

    def reload(self) -> None:
        """Re-read the chat and its path from the store (after it was changed from outside)."""
        self.chat = self.store.chat(self.chat_id)
        self.messages = self.store.messages(self.chat_id)
        self.history_changed.emit()

    def send(self, text: str) -> asyncio.Task:
        """Add a user message and start the reply."""
        if not text.strip():
            raise ValueError("cannot send an empty message")
        if self.running:
            raise RuntimeError("this chat is still replying; stop it first")
        self.messages.append(self.store.add_message(self.chat_id, "user", text))
        if len([m for m in self.messages if m.role == "user"]) == 1 and self.chat.title == "New chat":
            self.rename(text.strip().splitlines()[0][:48])
        return self._start()

    async def regenerate(self) -> asyncio.Task:
        """Answer the last user message again; the earlier replies stay as alternatives."""
        await self.stop()
        users = [i for i, m in enumerate(self.messages) if m.role == "user"]
        if not users:
            raise RuntimeError("nothing to regenerate: the chat has no user message")
        del self.messages[users[-1] + 1:]
        return self._start()

    async def regenerate_n(self, n: int) -> asyncio.Task:
        """Answer the last user message n times at once (alternatives.ExtraReplies): version 1 streams here,
        versions 2..n run in the same batch; all become versions of the reply (‹ 1/n ›)."""
        check_count(n)
        task = await self.regenerate()
        self.extras.start(self.messages[-1], n)
        return task

    async def edit(self, message_id: int, text: str) -> asyncio.Task:
        """Send a new version of a user message (the old one and its replies stay as an alternative)."""
        await self.stop()
        idx = next((i for i, m in enumerate(self.messages) if m.id == message_id), None)
        if idx is None or self.messages[idx].role != "user":
            raise ValueError(f"message {message_id} is not a user message of chat {self.chat_id}")
        if not text.strip():
            raise ValueError("cannot send an empty message")
        parent = self.messages[idx].parent_id
        del self.messages[idx:]
        self.messages.append(self.store.add_message(self.chat_id, "user", text, parent_id=parent))
        return self._start()

    async def continue_reply(self) -> asyncio.Task:
        """Extend the last reply where it stopped (interrupted, stopped, or cut at its token limit)."""
        await self.stop()
        if not self.can_continue():
            raise RuntimeError("nothing to continue: the last reply is complete")
        return self._start(continued=self.messages[-1])

    def select_alternative(self, message_id: int, step: int) -> int:
        """Show the previous (step -1) or next (+1) version of a message; returns the shown version's id."""
        if self.running:
            raise RuntimeError("this chat is still replying; stop it first")
        versions = self.store.alternatives(message_id)
        target = versions[max(0, min(len(versions) - 1, versions.index(message_id) + step))]
        self.store.select(self.chat_id, target)
        self.reload()
        return target

    def branch(self, message_id: int) -> int:
        """A new chat that shares this chat's history up to `message_id`; returns its id."""
        if not any(m.id == message_id for m in self.messages):
            raise ValueError(f"message {message_id} is not shown in chat {self.chat_id}")
        live = self.live(message_id)
        if live is not None:  # branching from a streaming reply takes its text so far
            self.store.update_reply(message_id, *live)
        return self.store.branch(self.chat_id, message_id).id

    async def stop(self) -> None:
        """Cancel the running reply (its pages return to the cache) and wait until it is recorded."""
        await self.extras.stop()
        task = self.task
        if task is None or task.done():
            return
        # The reply's consumer sees "cancelled" at once, but the job leaves the generator (and its pages
        # return) a step later; running stays true until both happened, so a new send can't overlap.
        reply = self._reply
        self._stopping += 1
        try:
            if not await self.backend.cancel(self.chat_id):
                task.cancel()  # no job yet (waiting for the model): stop waiting
            await asyncio.wait([task])
        finally:
            self._stopping -= 1
            if reply is not None:
                self.reply_changed.emit(reply.id)  # views refresh the Stop button

    # --- reply ---------------------------------------------------------------------------------

    def _start(self, continued: Message | None = None) -> asyncio.Task:
        if continued is None:
            reply = self.store.add_message(self.chat_id, "assistant", "", ReplyStats(state="queued"),
                                           parent_id=self.messages[-1].id if self.messages else None)
            self.messages.append(reply)
            tracker = ReplyTracker(self.clock())
        else:
            reply = continued
            tracker = ReplyTracker(self.clock(), text=reply.content, new_tokens=reply.stats.new_tokens)
        history = [{"role": m.role, "content": m.content} for m in self.messages[:-1]]
        if continued is not None:
            history.append({"role": "assistant", "content": reply.content})
        self._reply, self._tracker = reply, tracker
        self.history_changed.emit()
        self._set_activity("queued")
        self.task = asyncio.get_running_loop().create_task(self._run(reply, tracker, history))
        # A task cancelled before its first step never runs _run's finally: record it here then.
        self.task.add_done_callback(lambda _t: self._finish(reply, tracker, "stopped"))
        return self.task

    def _fit(self, history: list[dict], tracker: ReplyTracker) -> tuple[list[dict], ChatSettings]:
        """The prompt and settings that fit the backend's context; a backend that knows no limit or can't
        count (a remote server) gets the chat as it is."""
        limit = self.backend.context_limit()
        if limit is None or self.backend.count_tokens(history, self.settings) is None:
            return history, self.settings
        fit = fit_context(history, self.settings, self.backend.count_tokens, limit)
        tracker.stats.dropped_messages = fit.dropped
        return fit.history, replace(self.settings, max_new_tokens=fit.max_new_tokens)

    async def _run(self, reply: Message, tracker: ReplyTracker, history: list[dict]) -> None:
        try:
            await self.backend.wait_loaded()
            history, settings = self._fit(history, tracker)
            job, tracker.stats.prompt_tokens = self.backend.start_job(self.chat_id, history, settings)
            self._changed(reply)
            async for r in job:
                tracker.feed(r, self.clock())
                self._changed(reply)
            self._finish(reply, tracker, "stopped")  # "stopped" only if it ended without eos (generator closed)
        except asyncio.CancelledError:  # the task itself was cancelled (stop while waiting, app closing)
            await self.backend.cancel(self.chat_id)
            self._finish(reply, tracker, "stopped")
            raise
        except Exception as exc:  # noqa: BLE001 - shown under the reply, never raised into the loop
            log.warning("chat %s reply failed: %s", self.chat_id, exc)
            tracker.fail(exc)
            self._finish(reply, tracker, "error")

    def _set_activity(self, state: str) -> None:
        if state != self._activity:
            self._activity = state
            self.activity_changed.emit(state)

    def _finish(self, reply: Message, tracker: ReplyTracker, state_if_running: str) -> None:
        """Record the reply's end once: final text and stats to the store, views told."""
        if self._reply is not reply or self._tracker is not tracker:  # (a continued reply reuses its Message)
            return
        self.backend.job_ended(self.chat_id)
        if tracker.stats.state not in ("done", "stopped", "error"):
            tracker.stats.state = state_if_running
        if self._save_handle is not None:
            self._save_handle.cancel()
            self._save_handle = None
        reply.content, reply.stats = tracker.text, replace(tracker.stats)
        try:
            self.store.update_reply(reply.id, reply.content, reply.stats)
        except KeyError:  # the chat was deleted while this reply ran
            pass
        self._reply = self._tracker = None
        self._set_activity("")
        self.reply_finished.emit(reply.id)

    def _changed(self, reply: Message) -> None:
        if self._tracker is not None and self._tracker.stats.state in RUNNING_STATES:
            self._set_activity(self._tracker.stats.state)
        self.reply_changed.emit(reply.id)
        if self._save_handle is None:
            self._save_handle = asyncio.get_running_loop().call_later(SAVE_INTERVAL_S, self._save_partial)

    def _save_partial(self) -> None:
        self._save_handle = None
        if self._reply is not None:
            try:
                self.store.update_reply(self._reply.id, self._tracker.text, self._tracker.stats)
            except KeyError:  # deleted meanwhile; the task is being cancelled
                pass

"""One chat's conversation and its (at most one) running reply: job results -> text, stats, storage.

Timing comes from token events: the moment each streaming result carrying tokens reaches this
coroutine, never from repaints. The partial reply is written to the store at most SAVE_INTERVAL_S
after it changed (a timer, so a stalled stream is still saved), so a killed process loses at most
about that much of one reply and nothing already completed.

The conversation is the store's message tree seen as one path: regenerate and edit add a sibling (the
old version stays, reachable with select_alternative), continue_reply extends a stopped reply in place,
and branch copies the path up to a message into a new chat (with the chat's pinned documents).

A message submitted while a reply runs waits in the chat's queue (app.core.message_queue, persisted) and
is sent when the reply ends; pinned documents (app.core.documents) go into every prompt before the system
prompt, and a document that would leave no room in the model's context is refused when pinned.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.agent.live_reply import LiveReply
from app.agent.reply_rounds import MAX_ROUNDS, RoundParser, prompt_history, round_messages, rounds_markdown, rounds_of
from app.agent.tool_hub import Approval, Approver, ToolHub, ToolRequest
from app.chat.alternatives import ExtraReplies, check_count
from app.core.backend import Backend
from app.core.context import ContextFull, fit_context
from app.core.documents import DocumentError, PinnedDocument, PinnedDocuments, read_document, with_documents
from app.core.images import AttachedImage, MessageImages, cannot_see_message, sees_images, with_images
from app.core.message_queue import MessageQueue, QueuedMessage
from app.core.reply_trace import ReplyTrace, ToolCallRecord
from app.core.store import RUNNING_STATES, ChatSettings, Message, ReplyStats, Store
from app.core.store_errors import StoreWriteError

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
        self.live: LiveReply | None = None  # the reply as shown: thinking apart, tool rounds above the answer

    def next_round(self) -> None:
        """A tool round ended: the next round's text starts afresh, its tokens add to the reply's."""
        self.text = ""
        self._base_tokens = self.stats.new_tokens
        self._first_at = None
        self.stats.state, self.stats.eos_reason = "streaming", None

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
            delta = r.get("text", "")
            self.text += delta
            n = r.get("num_tokens", len(r.get("token_ids") or ()))  # remote streams count, not list, tokens
            if self.live is not None:
                self.live.feed(delta, n, now, r.get("tool_calls"))  # a remote server's parsed calls
            if n:
                if self._first_at is None:
                    self._first_at, self._first_n = now, self._base_tokens + n
                    if s.ttft_s is None:  # (a later tool round keeps the reply's first)
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
    queue_changed = Signal()  # a message was queued, edited, cancelled or sent from the queue
    documents_changed = Signal()

    def __init__(self, store: Store, chat_id: int, backend: Backend, parent: QObject | None = None,
                 clock: Callable[[], float] = time.perf_counter, tools: ToolHub | None = None):
        super().__init__(parent)
        self.store = store
        self.tools = tools  # the app's MCP tools; None: chats run without tools
        self.trace = ReplyTrace(store)
        self.approver: Approver | None = None  # asks the user before a tool call runs (the pane's dialog)
        self._note = ""  # what the running reply waits for (a tool call's approval or result)
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
        self.queue = MessageQueue(store)
        self.documents = PinnedDocuments(store)
        self.images = MessageImages(store)  # images attached to this store's messages
        if self.queue.items(chat_id):  # queued before a restart: the reply they waited for is over
            QTimer.singleShot(0, self, self.send_next)
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

    def prompt_settings(self) -> ChatSettings:
        """The settings the prompt is built from: the pinned documents lead the system message."""
        return with_documents(self.settings, self.documents.of(self.chat_id))

    def queued(self) -> list[QueuedMessage]:
        return self.queue.items(self.chat_id)

    def pinned(self) -> list[PinnedDocument]:
        return self.documents.of(self.chat_id)

    def live(self, message_id: int) -> tuple[str, ReplyStats] | None:
        """Current text and stats of the streaming reply (ahead of the stored copy)."""
        if self._reply is not None and self._reply.id == message_id:
            return self._tracker.text, self._tracker.stats
        return None

    def live_view(self, message_id: int) -> tuple[str, ReplyStats, str] | None:
        """The streaming reply as shown: (Markdown without its thinking, stats, a note on what it is doing:
        thinking with its token count and time, waiting for a tool call's approval or result)."""
        if self._reply is None or self._reply.id != message_id:
            return None
        tracker = self._tracker
        live = tracker.live
        if live is None:
            return tracker.text, tracker.stats, self._note
        note = self._note
        if not note and live.think_tokens:
            verb = "thinking…" if live.thinking_now else "thought for"
            note = f"{verb} {live.think_s:.1f} s · {live.think_tokens} tok"
        return live.display, tracker.stats, note

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

    def submit(self, text: str, images: list[AttachedImage] = ()) -> str:
        """Send `text` (and images) now, or queue it while a reply runs: "sent" or "queued"."""
        if not text.strip() and not images:
            raise ValueError("cannot send an empty message")
        if self.running and images:
            raise ValueError("a reply is running: send the image when it ends (only text waits in the queue)")
        if self.running:
            self.queue.add(self.chat_id, text)
            self.queue_changed.emit()
            return "queued"
        self.send(text, images)
        return "sent"

    def edit_queued(self, item_id: int, text: str) -> None:
        self.queue.edit(item_id, text)
        self.queue_changed.emit()

    def cancel_queued(self, item_id: int) -> None:
        self.queue.remove(item_id)
        self.queue_changed.emit()

    def send_next(self) -> None:
        """Send the oldest queued message if no reply runs (called when a reply ends)."""
        if self.running or self.store.closed:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop runs yet (a window restored before its loop starts): try again soon
            QTimer.singleShot(50, self, self.send_next)
            return
        item = self.queue.pop(self.chat_id)
        if item is not None:
            self.queue_changed.emit()
            self.send(item.content)

    def pin_document(self, path) -> PinnedDocument:
        """Pin a text or PDF file (see pin_text)."""
        return self.pin_text(*read_document(path))

    def pin_text(self, name: str, text: str) -> PinnedDocument:
        """Pin a document's text to this chat; DocumentError when it leaves no room in the model's context."""
        docs = self.pinned() + [PinnedDocument(0, self.chat_id, name, text)]
        settings = with_documents(self.settings, docs)
        limit, tokens = self.backend.context_limit(settings), self.backend.count_tokens([], settings)
        if limit is not None and tokens is not None and tokens >= limit:
            raise DocumentError(f"{name} is too big for the model's context: with the system prompt and this chat's "
                                f"other documents it takes {tokens:,} tokens, and the context holds {limit:,}. "
                                f"Pin a shorter document (or the part you need), or load a model with a longer context.")
        doc = self.documents.pin(self.chat_id, name, text)
        self.documents_changed.emit()
        self.settings_changed.emit()  # the context meter counts it
        return doc

    def unpin_document(self, doc_id: int) -> None:
        self.documents.unpin(doc_id)
        self.documents_changed.emit()
        self.settings_changed.emit()

    def send(self, text: str, images: list[AttachedImage] = ()) -> asyncio.Task:
        """Add a user message (with its images, in one transaction) and start the reply; ValueError, nothing
        stored, when the chat's model cannot see images."""
        if not text.strip() and not images:
            raise ValueError("cannot send an empty message")
        if self.running:
            raise RuntimeError("this chat is still replying; stop it first")
        if images and sees_images(self.backend, self.settings) is False:
            raise ValueError(cannot_see_message())
        self.messages.append(self.images.add_message(self.chat_id, "user", text, images))
        if len([m for m in self.messages if m.role == "user"]) == 1 and self.chat.title == "New chat" and text.strip():
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
        parent, images = self.messages[idx].parent_id, self.images.of(message_id)  # the new version keeps them
        del self.messages[idx:]
        self.messages.append(self.images.add_message(self.chat_id, "user", text, images, parent_id=parent))
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
        new = self.store.branch(self.chat_id, message_id)
        for old, copy in zip([m for m in self.messages if m.id <= message_id], self.store.messages(new.id)):
            self.trace.copy(old.id, copy.id)  # the branch keeps its replies' tool calls and thinking
            self.images.copy(old.id, copy.id)
        self.documents.copy(self.chat_id, new.id)
        return new.id

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
        self._reply, self._tracker = reply, tracker
        self.history_changed.emit()
        self._set_activity("queued")
        self.task = asyncio.get_running_loop().create_task(self._run(reply, tracker, list(self.messages[:-1]),
                                                                     continued is not None))
        # A task cancelled before its first step never runs _run's finally: record it here then.
        self.task.add_done_callback(lambda _t: self._finish(reply, tracker, "stopped"))
        return self.task

    def _fit(self, history: list[dict], tracker: ReplyTracker, tools: dict) -> tuple[list[dict], ChatSettings]:
        """The prompt and settings that fit the backend's context; a backend that knows no limit or can't
        count (a remote server) gets the chat as it is."""
        settings = self.prompt_settings()
        limit = self.backend.context_limit(settings)
        if limit is None or self.backend.count_tokens(history, settings, **tools) is None:
            return history, settings
        fit = fit_context(history, settings, lambda h, s: self.backend.count_tokens(h, s, **tools), limit)
        tracker.stats.dropped_messages = fit.dropped
        return fit.history, replace(settings, max_new_tokens=fit.max_new_tokens)

    async def _run(self, reply: Message, tracker: ReplyTracker, messages: list[Message], continued: bool) -> None:
        try:
            await self.backend.wait_loaded()
            template, runs_tools = self.backend.chat_template(self.settings), self.backend.runs_tools
            tools = await self.tools.chat_tools(self.settings.tools) if (
                self.tools is not None and runs_tools and self.settings.tools) else {}
            specs = {"tools": [t.function_spec(name) for name, t in tools.items()]} if tools else {}
            history = with_images(prompt_history(messages, self.trace.calls, template, runs_tools), messages,
                                  self.images.of, sees_images(self.backend, self.settings))
            tracker.live = LiveReply(template, bool(tools))
            round_ = 0
            if continued:  # the stopped reply's tool rounds come before the text it continues
                done = self.trace.calls(reply.id)
                round_ = done[-1].round + 1 if done else 0
                history += [m for r in rounds_of(done) for m in round_messages(r)]
                tracker.live.prior = rounds_markdown(done)
                thought = self.trace.thinking(reply.id)
                if thought is not None:
                    tracker.live.think_tokens, tracker.live.think_s = thought.tokens, thought.seconds
                history.append({"role": "assistant", "content": reply.content})
            while True:
                prepare = getattr(self.backend, "prepare_images", None)  # images encoded off the loop, first
                if prepare is not None:
                    await prepare(history, self.prompt_settings(), specs.get("tools"))
                fitted, settings = self._fit(history, tracker, specs)
                # (a continued reply's text is fed from its start, so its prompt's open think block is no news)
                tracker.live.start_round(None if continued else self.backend.render_prompt(fitted, settings,
                                                                                           specs.get("tools")))
                job, tracker.stats.prompt_tokens = self.backend.start_job(self.chat_id, fitted, settings, **specs)
                if continued:
                    tracker.live.feed(reply.content, 0, self.clock())
                    continued = False
                self._changed(reply)
                async for r in job:
                    tracker.feed(r, self.clock())
                    self._changed(reply)
                parts = tracker.live.end_round()
                if not parts.tool_calls or tracker.stats.state != "done":
                    break
                if round_ + 1 >= MAX_ROUNDS:
                    tracker.stats.error = f"stopped after {MAX_ROUNDS} rounds of tool calls"
                    break
                self.backend.job_ended(self.chat_id)
                tracker.stats.state = "streaming"  # still running (a crash now leaves it "interrupted")
                records = await self._run_calls(reply, round_, parts, tools)
                tracker.live.add_round(records)
                history += round_messages(records)
                tracker.next_round()
                round_ += 1
            self._finish(reply, tracker, "stopped")  # "stopped" only if it ended without eos (generator closed)
        except asyncio.CancelledError:  # the task itself was cancelled (stop while waiting, app closing)
            await self.backend.cancel(self.chat_id)
            self._finish(reply, tracker, "stopped")
            raise
        except Exception as exc:  # noqa: BLE001 - shown under the reply, never raised into the loop
            log.warning("chat %s reply failed: %s", self.chat_id, exc)
            tracker.fail(exc)
            self._finish(reply, tracker, "error")

    async def _run_calls(self, reply: Message, round_: int, parts: RoundParser, tools: dict) -> list[ToolCallRecord]:
        """Run one round's calls in order, each approved first; each is recorded before and after it runs."""
        records = []
        try:
            for call in parts.tool_calls:
                tool = tools.get(call.name)
                record = self.trace.add_call(reply.id, round_, call.id, tool.server if tool else "", call.name,
                                             call.arguments_json, parts.content.strip(), parts.reasoning, "running")
                records.append(record)
                self._note = f"calling {call.name}…"
                self._changed(reply)
                state, text = await self.tools.run_call(self.chat_id, tool, call.name, call.arguments_json,
                                                        self._ask)
                self.trace.finish_call(record, state, text)
        except asyncio.CancelledError:
            for record in records:
                if record.state == "running":
                    self.trace.finish_call(record, "error", "the reply was stopped during the call")
            raise
        finally:
            self._note = ""
        return records

    async def _ask(self, request: ToolRequest) -> Approval:
        if self.approver is None:
            return Approval(False)
        self._note = f"waiting for your approval of {request.tool.name}…"
        if self._reply is not None:
            self._changed(self._reply)
        try:
            return await self.approver(request)
        finally:
            self._note = f"calling {request.tool.name}…"

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
            if tracker.live is not None and tracker.live.think_tokens:
                self.trace.set_thinking(reply.id, tracker.live.think_tokens, tracker.live.think_s)
        except KeyError:  # the chat was deleted while this reply ran
            pass
        except StoreWriteError:  # the disk refused it: the window says so; the reply is still on screen
            log.warning("reply %s not saved", reply.id, exc_info=True)
        self._reply = self._tracker = None
        self._set_activity("")
        self.reply_finished.emit(reply.id)
        # A reply that ended by itself sends the queue on (after the views saw the end); a stopped one waits
        # for whoever stopped it: the user's Stop sends it on (ChatPane.stop), closing the app keeps it.
        if reply.stats.state != "stopped" and self.queue.items(self.chat_id):
            QTimer.singleShot(0, self, self.send_next)

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
            except StoreWriteError:  # the disk refused it (full): told in the window, retried at the next save
                pass

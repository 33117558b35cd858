"""ReplyRun: a chat's running reply, from its start to its end recorded in the store.

Fitting the chat into the model's context, the job (and the rounds of tool calls a reply may make, each
call approved first), the stream folded by a ReplyTracker, and the end recorded once whichever way it
comes (done, stopped, an error, the task cancelled). It is a mixin over ChatSession's state (`store`,
`backend`, `_reply`, `_tracker`, its signals).

Timing comes from token events: the moment each streaming result carrying tokens reaches this
coroutine, never from repaints. The partial reply is written to the store at most SAVE_INTERVAL_S
after it changed (a timer, so a stalled stream is still saved), so a killed process loses at most
about that much of one reply and nothing already completed.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from PySide6.QtCore import QTimer

from app.agent.live_reply import LiveReply
from app.agent.reply_rounds import MAX_ROUNDS, RoundParser, prompt_history, round_messages, rounds_markdown, rounds_of
from app.agent.tool_hub import Approval, ToolRequest
from app.chat.reply_tracker import ReplyTracker
from app.core.context import fit_context, reply_filled_message
from app.core.context_window import STOP_AT_LIMIT
from app.core.images import sees_images, with_images
from app.core.reply_trace import ToolCallRecord
from app.core.store import RUNNING_STATES, ChatSettings, Message, ReplyStats
from app.core.store_errors import StoreWriteError

log = logging.getLogger(__name__)

SAVE_INTERVAL_S = 0.5


class ReplyRun:
    """ChatSession's running reply: start, run (with its tool rounds), finish, save."""

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
        """The prompt and settings that fit the backend's context (the chat's context overflow policy); a
        backend that knows no limit or can't count (a remote server) gets the chat as it is. A stop-at-limit
        reply whose budget is all the room left is told, when it uses it up, that the context is full."""
        settings = self.prompt_settings()
        limit = self.backend.context_limit(settings)
        if limit is None or self.backend.count_tokens(history, settings, **tools) is None:
            return history, settings
        fit = fit_context(history, settings, lambda h, s: self.backend.count_tokens(h, s, **tools), limit)
        tracker.stats.dropped_messages, tracker.stats.dropped_turns = fit.dropped, fit.dropped_turns
        tracker.full_message = (reply_filled_message(limit) if fit.fills_context
                                and settings.context_overflow == STOP_AT_LIMIT else None)
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
            tracker.live = LiveReply(template, tools)  # (the names the model sees)
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

"""ReplyTracker: one job's results folded into a reply's text and ReplyStats (state, timing, token counts).

Timing comes from token events: the moment each streaming result carrying tokens reaches the reply's
coroutine, never from repaints. A reply of several tool rounds is one reply: each round's tokens add
to its count, and its time to first token is the first round's.
"""
from __future__ import annotations

import json

from app.agent.live_reply import LiveReply
from app.core.context import ContextFull
from app.core.store import ReplyStats


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
        self.full_message: str | None = None  # said when the reply ends at its budget: the context is full

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
        if s.eos_reason == "max_new_tokens" and self.full_message is not None:
            s.error = self.full_message
        for key in ("prompt_tokens", "cached_tokens"):
            if r.get(key) is not None:
                setattr(s, key, r[key])
        if r.get("new_tokens") is not None:
            s.new_tokens = self._base_tokens + r["new_tokens"]

    def fail(self, exc: BaseException) -> None:
        self.stats.state = "error"
        self.stats.error = str(exc) if isinstance(exc, ContextFull) else f"{type(exc).__name__}: {exc}"

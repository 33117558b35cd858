"""A streaming reply as the chat shows it: thinking apart (with its token count and time), the answer,
and the tool rounds before it, never half a call.

The raw text of the round under way stays the reply's text (what is stored and continued); this is the
view of it. Thinking tokens are the tokens that arrived while the round was inside its think block; its
time runs from the first of them to the last. A remote server parses its model's calls itself: they come
as complete calls with a round's last result and join the calls parsed from the text.
"""
from __future__ import annotations

from collections.abc import Iterable

from app.agent.reply_rounds import RoundParser, rounds_markdown
from app.core.reply_trace import ToolCallRecord
from engine.chat import ToolCall


class LiveReply:
    """tool_names: the chat's tools, by the names the model sees (none: the reply's text is all text)."""

    def __init__(self, template: str | None, tool_names: Iterable[str] = ()):
        self.template = template
        self.tool_names = tuple(tool_names)
        self.parse_calls = bool(self.tool_names)
        self.parser = RoundParser(template)
        self.prior = ""  # Markdown of the finished tool rounds (their text and call blocks)
        self._thoughts: list[str] = []  # finished rounds' thinking
        self.think_tokens = 0
        self.think_s = 0.0
        self._think_from: float | None = None
        self._think_base = 0.0
        self._calls: list[ToolCall] = []  # the round's calls as a server parsed them

    def start_round(self, prompt: str | None) -> None:
        self.parser = RoundParser(self.template, prompt, self.tool_names)
        self._think_base, self._think_from = self.think_s, None
        self._calls = []

    def feed(self, text: str, tokens: int, now: float, calls: list[ToolCall] | None = None) -> None:
        if calls and self.parse_calls:
            self._calls += calls
        before = len(self.parser.reasoning)
        self.parser.feed(text)
        if tokens and (self.parser.in_reasoning or len(self.parser.reasoning) > before):
            self.think_tokens += tokens
            if self._think_from is None:
                self._think_from = now
            self.think_s = self._think_base + (now - self._think_from)

    def end_round(self) -> RoundParser:
        """The round's model text is complete: its parts (and its calls, when any)."""
        self.parser.finish()
        self.parser.tool_calls += self._calls
        self._calls = []
        return self.parser

    def add_round(self, records: list[ToolCallRecord]) -> None:
        """A round's calls have run: its text and call blocks join what the reply shows above its answer."""
        self.prior += rounds_markdown(records)
        if self.parser.reasoning:
            self._thoughts.append(self.parser.reasoning)

    @property
    def display(self) -> str:
        return self.prior + self.parser.content

    @property
    def reasoning(self) -> str:
        return "\n\n".join(self._thoughts + ([self.parser.reasoning] if self.parser.reasoning else []))

    @property
    def thinking_now(self) -> bool:
        return self.parser.in_reasoning

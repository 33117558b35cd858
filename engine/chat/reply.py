"""A model's reply read as it streams: thinking, answer text and tool calls, each handed out once decided.

The reply's text goes through the reasoning splitter first; only the answer part goes on to the tool
call parser (a call written while thinking is a thought, not a call). When the offered functions' names
are known, the text that parser lets through goes on to the plain JSON call parser (engine.chat.
json_tool_calls: the fenced or bare JSON calls small models write instead of their format's markers).
The server turns the deltas into OpenAI's `reasoning_content`, `content` and `tool_calls`; the app shows
them the same way. A harmony reply (gpt-oss: markers HARMONY) is made of channels instead, and
engine.chat.harmony_parser reads all three parts from them.
"""
from __future__ import annotations

from collections.abc import Iterable

from .harmony_parser import HarmonyParser
from .json_tool_calls import JsonCallParser
from .reasoning import HARMONY, ReasoningMarkers, ReasoningParser, reasoning_markers, starts_in_reasoning
from .reply_delta import ReplyDelta
from .tool_calls import ToolCall, ToolCallFormat, ToolCallPiece


class ReplyParser:
    """Streaming reader of one reply. markers: the template's think markers (None: no reasoning split);
    in_reasoning: the prompt opened the think block; tool_format: parse calls in that format (None: the
    answer is all text); tool_names: the offered functions (plain JSON naming one of them is a call too;
    none given: only the format's own calls); parallel: False keeps only the first call (OpenAI's
    parallel_tool_calls)."""

    def __init__(self, markers: ReasoningMarkers | None = None, *, in_reasoning: bool = False,
                 tool_format: ToolCallFormat | None = None, parallel: bool = True, tool_names: Iterable[str] = ()):
        self._reasoning = ReasoningParser(markers, in_reasoning=in_reasoning and markers is not None) \
            if markers is not HARMONY else None
        # harmony: the channels say what is thinking, answer and call (calls kept only where tools are parsed)
        self._harmony = HarmonyParser(parallel) if markers is HARMONY else None
        self._harmony_calls = tool_format is not None
        names = frozenset(tool_names)
        self._tools = tool_format.parser(names or None) if tool_format is not None else None
        self._json = JsonCallParser(names) if self._tools is not None and names else None
        self.parallel = parallel
        self.reasoning = ""
        self.content = ""
        self.tool_calls: list[ToolCall] = []

    @classmethod
    def for_prompt(cls, template: str | None, prompt: str, *, split_reasoning: bool = True,
                   tool_format: ToolCallFormat | None = None, parallel: bool = True,
                   tool_names: Iterable[str] = ()) -> ReplyParser:
        """The parser for a reply to `prompt` (rendered by `template`): markers from the template, and
        whether the prompt already opened the think block."""
        markers = reasoning_markers(template) if split_reasoning else None
        return cls(markers, in_reasoning=starts_in_reasoning(prompt, markers), tool_format=tool_format,
                   parallel=parallel, tool_names=tool_names)

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed last is inside the reply's thinking."""
        return (self._harmony or self._reasoning).in_reasoning

    def feed(self, text: str) -> ReplyDelta:
        if self._harmony is not None:
            return self._channels(self._harmony.feed(text))
        reasoning, content = self._reasoning.feed(text)
        return self._delta(reasoning, content, final=False)

    def finish(self) -> ReplyDelta:
        if self._harmony is not None:
            return self._channels(self._harmony.finish())
        reasoning, content = self._reasoning.finish()
        return self._delta(reasoning, content, final=True)

    def _channels(self, delta: ReplyDelta) -> ReplyDelta:
        """A harmony delta taken in (its calls dropped where the reply's calls are not parsed)."""
        if not self._harmony_calls:
            delta.tool_calls, delta.call_pieces = [], []
        self.reasoning += delta.reasoning
        self.content += delta.content
        self.tool_calls += delta.tool_calls
        return delta

    def _delta(self, reasoning: str, content: str, final: bool) -> ReplyDelta:
        calls: list[ToolCall] = []
        pieces: list[ToolCallPiece] = []
        if self._tools is not None:
            content = self._tools.feed(content)
            calls = self._tools.take_calls()
            if final:
                rest, last = self._tools.finish()
                content += rest
                calls += last
            pieces = self._tools.take_pieces()
            if self._json is not None:
                content = self._json.feed(content)
                if final:
                    content += self._json.finish()
                    # (each comes whole, in one piece: only the reply's end shows that nothing follows it)
                    more = [ToolCall(self._tools.fmt.new_id(), name, args) for name, args in self._json.calls]
                    first = len(self._tools.calls)  # numbered after the format's own calls
                    calls += more
                    pieces += [ToolCallPiece(first + i, c.arguments_json, c.id, c.name) for i, c in enumerate(more)]
            if not self.parallel:
                calls = calls[:max(0, 1 - len(self.tool_calls))]
                pieces = [p for p in pieces if p.index == 0]
        self.reasoning += reasoning
        self.content += content
        self.tool_calls += calls
        return ReplyDelta(reasoning, content, calls, pieces)


def split_reply(text: str, markers: ReasoningMarkers | None = None, *, in_reasoning: bool = False,
                tool_format: ToolCallFormat | None = None, parallel: bool = True,
                tool_names: Iterable[str] = ()) -> ReplyDelta:
    """A whole reply's (reasoning, content, tool_calls), exactly as streaming it gives."""
    parser = ReplyParser(markers, in_reasoning=in_reasoning, tool_format=tool_format, parallel=parallel,
                         tool_names=tool_names)
    parser.feed(text)
    parser.finish()
    return ReplyDelta(parser.reasoning, parser.content, parser.tool_calls)

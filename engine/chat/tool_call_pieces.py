"""A tool call streamed in pieces, as OpenAI and vLLM stream them: the first piece carries the call's
index, id and name, the later ones the arguments text as the model writes it (the pieces' arguments add
up to the call's). ToolCallParser (engine.chat.tool_calls) decides where calls are; LiveCall follows the
arguments object of the call a region is writing, to send its text before the call is complete.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCallPiece:
    """One streamed part of a call, OpenAI's `delta.tool_calls` entry: the first piece of a call has its
    id and name (and maybe the start of the arguments), later pieces only more arguments text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class LiveCall:
    """The call a region is streaming: its id and name are sent; its arguments object is sent as it
    grows, up to its closing brace (found by bracket depth outside strings). Arguments that are not an
    object (a JSON string, say) wait for the whole region."""

    def __init__(self, index: int, call_id: str, name: str, at: int):
        self.index, self.id, self.name, self.at = index, call_id, name, at
        self.start: int | None = None  # where the object starts in the region
        self.streamable = True
        self.end: int | None = None  # just past its closing brace
        self._pos = self._sent = self._depth = 0
        self._in_str = self._esc = False

    def advance(self, text: str) -> str:
        """The arguments text that `text` (the region so far) adds."""
        if self.start is None and self.streamable:
            rest = text[self.at:].lstrip()
            if not rest:
                return ""
            self.streamable = rest[0] == "{"
            self.start = self._pos = self._sent = len(text) - len(rest)
        if not self.streamable:
            return ""
        i = self._pos
        while i < len(text) and self.end is None:
            c = text[i]
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    self._in_str = False
            elif c == '"':
                self._in_str = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.end = i + 1
            i += 1
        self._pos = i
        upto = self.end if self.end is not None else len(text)
        out, self._sent = text[self._sent:upto], max(self._sent, upto)
        return out

    def sent(self, text: str) -> str:
        return text[self.start:self._sent] if self.start is not None else ""

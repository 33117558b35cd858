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


class JsonBrackets:
    """Where a JSON object or array ends, for one whose start stays put while text arrives: bracket depth
    outside strings, each character scanned once, so a long held value costs no more as it grows."""

    def __init__(self):
        self.seen = self.depth = 0
        self.in_str = self.esc = False
        self.length: int | None = None

    def end(self, s: str, j: int) -> int | None:
        """Just past the value that starts at s[j], or None while it is unfinished."""
        k = j + self.seen
        while self.length is None and k < len(s):
            c = s[k]
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif c == "\\":
                    self.esc = True
                elif c == '"':
                    self.in_str = False
            elif c == '"':
                self.in_str = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.length = k + 1 - j
            k += 1
        self.seen = k - j
        return None if self.length is None else j + self.length


class LiveCall:
    """The call a region is streaming: its id and name are sent; its arguments object is sent as it
    grows, up to its closing brace (found by bracket depth outside strings). Arguments that are not an
    object (a JSON string, say) wait for the whole region."""

    def __init__(self, index: int, call_id: str, name: str, at: int):
        self.index, self.id, self.name, self.at = index, call_id, name, at
        self.start: int | None = None  # where the object starts in the region
        self.streamable = True
        self.end: int | None = None  # just past its closing brace
        self._sent = 0
        self._brackets = JsonBrackets()

    def advance(self, text: str) -> str:
        """The arguments text that `text` (the region so far) adds."""
        if self.start is None and self.streamable:
            rest = text[self.at:].lstrip()
            if not rest:
                return ""
            self.streamable = rest[0] == "{"
            self.start = self._sent = len(text) - len(rest)
        if not self.streamable:
            return ""
        self.end = self._brackets.end(text, self.start)
        upto = self.end if self.end is not None else len(text)
        out, self._sent = text[self._sent:upto], max(self._sent, upto)
        return out

    def sent(self, text: str) -> str:
        return text[self.start:self._sent] if self.start is not None else ""

"""A harmony reply (gpt-oss) read as it streams: thinking, answer and tool calls from its channels.

The reply follows the prompt's `<|start|>assistant`, decoded with its special tokens, and is a run of
messages: `<|channel|>analysis<|message|>…<|end|>` (thinking), `<|start|>assistant<|channel|>final
<|message|>…` (the answer, ended by `<|return|>`, a stop token), and calls:
`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}` ended by `<|call|>` (also a
stop token; the recipient may also stand before the channel). A commentary message to no one is a
preamble the model says before its calls: it is answer text. Each message's text is handed out as it
comes (only a possible special token's start is held back until the next piece shows what it is); a
call is handed out as OpenAI streams calls: its id and name once its header is complete, then its
arguments text as written, the whole call when its message ends.

A reply that writes no header at all (text straight away) is answer text. engine.chat.harmony says why
this parser is pagedeck's own rather than the openai-harmony package's.
"""
from __future__ import annotations

import re

from .harmony import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, SPECIAL_TOKENS, START
from .reply_delta import ReplyDelta
from .tool_call_pieces import ToolCallPiece
from .tool_calls import ToolCall, ToolCallFormat

_CLOSERS = (END, CALL, RETURN, START)  # what ends a message's text
_HEADER_LIMIT = 256  # a reply's start with no <|message|> in this many characters is plain text
_RECIPIENT = re.compile(r"to=(\S+?)(?=\s|<\||$)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")


def _held(text: str) -> int:
    """Length of the longest suffix of `text` that may still become a special token."""
    for n in range(min(len(text), max(map(len, SPECIAL_TOKENS)) - 1), 0, -1):
        if any(t.startswith(text[-n:]) for t in SPECIAL_TOKENS):
            return n
    return 0


class HarmonyParser:
    """Streaming: feed() the reply's text, get a ReplyDelta (reasoning, content, complete calls and the
    calls' streamed pieces); finish() ends it. parallel: False keeps only the first call."""

    def __init__(self, parallel: bool = True):
        self.parallel = parallel
        self.state = "header"  # header (up to <|message|>), body (a message's text), between (after <|end|>), done
        self.kind = ""  # the message under way: "reasoning", "content" or "call"
        self._buf = ""
        self._call: ToolCallPiece | None = None  # the call under way (its first piece)
        self._args = ""
        self._started = False  # a message header has been seen (else the reply may be plain text)
        self._ids = ToolCallFormat()
        self.calls: list[ToolCall] = []

    @property
    def in_reasoning(self) -> bool:
        return self.state == "body" and self.kind == "reasoning"

    def feed(self, text: str) -> ReplyDelta:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> ReplyDelta:
        delta = self._run(final=True)
        if self.state == "header" and not self._started:  # never a header: the reply was plain text
            delta.content += self._buf
        elif self.state == "body":
            self._text(delta, self._buf)
            self._close(delta)
        self._buf, self.state = "", "done"
        return delta

    # ---- the machine --------------------------------------------------------------------------
    def _run(self, final: bool) -> ReplyDelta:
        delta = ReplyDelta()
        while self._buf and self.state != "done":
            if self.state == "between":
                at = self._buf.find(START)
                chan = self._buf.find(CHANNEL)
                if at < 0 and chan < 0:
                    self._buf = self._buf[len(self._buf) - _held(self._buf):] if not final else ""
                    break
                at = min(x for x in (at, chan) if x >= 0)
                self._buf = self._buf[at + (len(START) if self._buf.startswith(START, at) else 0):]
                self.state = "header"
            elif self.state == "header":
                at = self._buf.find(MESSAGE)
                if at < 0:
                    if not self._started and (len(self._buf) > _HEADER_LIMIT or "\n" in self._buf) \
                            and "<|" not in self._buf:
                        self.state, self.kind, self._started = "body", "content", True  # plain text, no header
                        continue
                    break
                self._open(self._buf[:at], delta)
                self._buf = self._buf[at + len(MESSAGE):]
            else:  # body
                ends = [(i, t) for t in _CLOSERS if (i := self._buf.find(t)) >= 0]
                if not ends:
                    keep = 0 if final else _held(self._buf)
                    self._text(delta, self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                at, token = min(ends)
                self._text(delta, self._buf[:at])
                self._close(delta)
                self._buf = self._buf[at + (0 if token == START else len(token)):]
                self.state = "done" if token in (CALL, RETURN) else "between"
        return delta

    def _open(self, header: str, delta: ReplyDelta) -> None:
        """A message's header is complete: what its text will be."""
        self._started = True
        self.state = "body"
        chan = _CHANNEL_NAME.search(header)
        channel = chan.group(1) if chan else ""
        to = _RECIPIENT.search(header.replace(CONSTRAIN, " "))
        recipient = to.group(1) if to else ""
        if recipient and recipient != "assistant":
            self.kind = "call"
            name = recipient.removeprefix("functions.")
            self._call, self._args = ToolCallPiece(len(self.calls), "", self._ids.new_id(), name), ""
            if self._wanted():
                delta.call_pieces.append(self._call)
        else:
            self.kind = "reasoning" if channel == "analysis" else "content"

    def _text(self, delta: ReplyDelta, text: str) -> None:
        if not text:
            return
        if self.kind == "reasoning":
            delta.reasoning += text
        elif self.kind == "call":
            self._args += text
            if self._wanted():
                delta.call_pieces.append(ToolCallPiece(self._call.index, text))
        else:
            delta.content += text

    def _close(self, delta: ReplyDelta) -> None:
        """The message under way ended: a call is complete."""
        if self.kind == "call" and self._call is not None:
            if self._wanted():
                if not self._args.strip():  # a call with no arguments: an empty object
                    self._args += "{}"
                    delta.call_pieces.append(ToolCallPiece(self._call.index, "{}"))
                call = ToolCall(self._call.id, self._call.name, self._args)
                self.calls.append(call)
                delta.tool_calls.append(call)
            self._call = None
        self.kind = ""

    def _wanted(self) -> bool:
        return self.parallel or not self.calls

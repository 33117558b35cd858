"""Tool calls written as plain JSON instead of the template's call format, known by naming an offered tool.

Small models often skip the call markers their template teaches (engine.chat.tool_calls) and write the
call as JSON: Qwen2.5-Coder answers with a fenced ```json block, Llama 3.2 writes `{"type": "function",
"name": ..., "parameters": ...}` (maybe after `<|python_tag|>`), others `{"function": ..., "arguments":
...}` or a list of calls. llama.cpp's chat parsers accept fenced and bare `{"name": ...}` JSON where the
tags are missing; Ollama's parser finds calls by the offered tools' names. JsonCallParser reads the answer
text that the format's own parser let through and makes it calls when the reply is, or ends in:

- regions of: an optional `<|python_tag|>`, an optional fence (```json, ``` or ```tool_call), one JSON
  value, the closing fence; regions may follow each other (whitespace or `;` between them);
- each value a call object or a non-empty list of them: {"name": N, "arguments" | "parameters": {...}},
  {"function": N, "arguments" | "parameters": {...}} or {"function": {"name": N, "arguments": {...}}},
  "type": "function" and "id" allowed beside; N one of the offered functions, the arguments an object
  (or the JSON text of one).

Anything else stays text: JSON that names no offered function, has other keys (a tool's schema echoed
back has a "description"), or is followed by more text (then it was an example or an answer, not a
call). Streaming, text from a place where such a region may start (`{`, `[`, a fence, `<|python_tag|>`)
is held back while it can still be one: released as soon as its first key, its function's name (checked
letter by letter against the offered names) or its fence's language rules it out, or once text follows
the complete JSON. The calls are handed out when the reply ends (only then is it known that nothing
follows them), each whole; a region cut off by the end of the reply is dropped once it has named an
offered function (it was a call), else shown as text.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from .tool_call_pieces import JsonBrackets
from .tool_calls import _held_suffix

PYTHON_TAG = "<|python_tag|>"
FENCE = "```"
_FENCE_LANGS = ("", "json", "tool_call")
_FENCE_OPEN = re.compile(r"```([A-Za-z_]*)[ \t]*\r?\n")
_FENCE_PARTIAL = re.compile(r"```([A-Za-z_]*)")
_START = re.compile(r"[{\[]|```|<\|python_tag\|>")
_KEYS = ("name", "function", "type", "arguments", "parameters", "id")  # the keys a call object may have
_ARGS_KEYS = ("arguments", "parameters")
_WS = " \t\r\n"


def _arguments(value) -> str | None:
    if isinstance(value, str):  # some models write the arguments as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


def call_of(obj, names: frozenset[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) of one call object naming an offered function, or None if it isn't one."""
    if not isinstance(obj, dict) or not set(obj) <= set(_KEYS) or obj.get("type", "function") != "function":
        return None
    fn = obj.get("function")
    if isinstance(fn, dict):  # {"type": "function", "function": {"name": ..., "arguments": ...}}
        return call_of(fn, names) if set(obj) <= {"function", "type", "id"} else None
    if isinstance(fn, str):
        if "name" in obj:
            return None
        obj = {**obj, "name": fn}
    name, given = obj.get("name"), [k for k in _ARGS_KEYS if k in obj]
    if not isinstance(name, str) or name not in names or len(given) != 1:
        return None
    args = _arguments(obj[given[0]])
    return (name, args) if args is not None else None


def calls_of(value, names: frozenset[str]) -> list[tuple[str, str]] | None:
    """The calls of one JSON value (a call object, or a non-empty list of them), or None."""
    items = value if isinstance(value, list) else [value]
    calls = [call_of(v, names) for v in items]
    return calls if calls and all(calls) else None  # type: ignore[return-value]


def _skip(text: str, i: int, chars: str = _WS) -> int:
    while i < len(text) and text[i] in chars:
        i += 1
    return i


def _string(text: str, i: int) -> tuple[str, int, bool]:
    """The JSON string starting at text[i] (a quote), as far as it goes: (raw body, end, closed)."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == '"':
            return text[i + 1:j], j + 1, True
        j += 1
    return text[i + 1:], len(text), False


@dataclass
class _Verdict:
    """What the text from a possible start is: "open" (undecided), "text" (its first `n` characters are
    text for sure), "calls" (calls, running to the end of the reply)."""

    kind: str
    n: int = 0
    calls: list[tuple[str, str]] = field(default_factory=list)
    end: int = 0  # "calls" of one region: where it ends
    cut: bool = False  # "calls" at the end of the reply: a cut-off call followed


class JsonCallParser:
    """Streaming: feed() returns the text that can no longer be (part of) a call; finish() the rest, after
    which `calls` holds the calls found as (name, arguments JSON). Whitespace between text and the calls
    is dropped (it belongs to the calls' layout)."""

    def __init__(self, names: Iterable[str]):
        self.names = frozenset(names)
        self.calls: list[tuple[str, str]] = []
        self._buf = ""
        self._offset = 0  # characters of the reply before _buf
        self._base = 0  # where the text _sequence reads starts in the reply
        self._values: dict[int, JsonBrackets] = {}  # held JSON values by where they start in the reply

    def feed(self, text: str) -> str:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> str:
        return self._run(final=True)

    def _run(self, final: bool) -> str:
        out = []
        while self._buf:
            buf = self._buf
            p = self._start(buf, final)
            if p < 0:  # no call can start here: text, but trailing whitespace waits (a call may follow it)
                keep = 0 if final else len(buf) - len(buf.rstrip(_WS))
                out.append(self._drop(len(buf) - keep))
                break
            self._base = self._offset + p
            v = self._sequence(buf[p:], final)
            if v.kind == "text":
                out.append(self._drop(p + v.n))
                continue
            out.append(buf[:p].rstrip(_WS))
            if v.kind == "open":
                self._drop(len(out[-1]))
            else:
                self.calls += v.calls
                self._drop(len(buf))
            break
        return "".join(out)

    def _drop(self, n: int) -> str:
        """The first n characters of the held text, no longer held."""
        out, self._buf, self._offset = self._buf[:n], self._buf[n:], self._offset + n
        self._values = {at: v for at, v in self._values.items() if at >= self._offset}
        return out

    @staticmethod
    def _start(buf: str, final: bool) -> int:
        """Where the first possible region starts (or the start of a marker cut by the end), or -1."""
        m = _START.search(buf)
        at = m.start() if m else -1
        held = 0 if final else _held_suffix(buf, (FENCE, PYTHON_TAG))
        if held and (at < 0 or len(buf) - held < at):
            at = len(buf) - held
        return at

    def _sequence(self, s: str, final: bool) -> _Verdict:
        """Regions from s[0] (a possible start) to the end of the text."""
        calls: list[tuple[str, str]] = []
        first_end, i = 0, 0
        while True:
            j = _skip(s, i, _WS + ";") if calls else i
            if j == len(s):  # the calls so far end the text: at the reply's end they are calls
                return _Verdict("calls", calls=calls) if final else _Verdict("open")
            v = self._region(s, j, final)
            if v.kind == "open":
                return v
            if v.kind == "text":  # not a call: the first region (or the text the verdict names) is text
                return _Verdict("text", first_end) if calls else v
            calls += v.calls
            if v.cut:
                return _Verdict("calls", calls=calls)
            first_end, i = first_end or v.end, v.end

    def _region(self, s: str, start: int, final: bool) -> _Verdict:
        """One region at s[start]: "open", "text" (n counted from `start`) or "calls" ending at `end`."""
        i = start
        undecided = _Verdict("text", len(s) - start) if final else _Verdict("open")
        rest = s[i:]
        if rest.startswith(PYTHON_TAG):
            i = _skip(s, i + len(PYTHON_TAG))
        elif PYTHON_TAG.startswith(rest) and rest.startswith("<"):
            return undecided
        if i == len(s):
            return undecided
        fenced = s.startswith(FENCE, i)
        if fenced:
            m = _FENCE_OPEN.match(s, i)
            if m is None:
                part = _FENCE_PARTIAL.match(s, i)
                if part.end() == len(s) and any(lang.startswith(part.group(1).lower()) for lang in _FENCE_LANGS):
                    return undecided
                if not final and re.fullmatch(r"[ \t\r]*", s[part.end():]) and part.group(1).lower() in _FENCE_LANGS:
                    return undecided
                return _Verdict("text", i + len(FENCE) - start)
            if m.group(1).lower() not in _FENCE_LANGS:
                return _Verdict("text", m.end() - start)
            i = m.end()
        elif s[i] == "`":
            return undecided if FENCE.startswith(s[i:]) else _Verdict("text", i + 1 - start)
        j = _skip(s, i)
        end = self._values.setdefault(self._base + j, JsonBrackets()).end(s, j) if s[j:j + 1] in ("{", "[") else None
        if end is None:  # unfinished (or no object or array at all)
            head = self._head(s[i:])
            if head == "no":
                return _Verdict("text", max(i - start, 1))
            if not final:
                return _Verdict("open")
            return _Verdict("calls", cut=True) if head == "named" else _Verdict("text", len(s) - start)
        try:
            value = json.loads(s[j:end])
        except json.JSONDecodeError:
            return _Verdict("text", max(i - start, 1))
        calls = calls_of(value, self.names)
        j = end
        if calls is None:
            return _Verdict("text", j - start)
        if fenced:
            k = _skip(s, j)
            if s.startswith(FENCE, k):
                j = k + len(FENCE)
            elif FENCE.startswith(s[k:]):  # the closing fence may still come (at the end: a call all the same)
                if not final:
                    return _Verdict("open")
                j = len(s)
            else:
                return _Verdict("text", j - start)
        return _Verdict("calls", calls=calls, end=j)

    def _head(self, t: str) -> str:
        """Whether unfinished JSON text `t` may still be a call: "no", "maybe", or "named" (its first call
        object names an offered function). Read up to the first key and, if that is "name" or "function",
        the name after it."""
        i = _skip(t, 0)
        if t.startswith("[", i):
            i = _skip(t, i + 1)
        if i == len(t):
            return "maybe"
        if t[i] != "{":
            return "no"
        i = _skip(t, i + 1)
        if i == len(t):
            return "maybe"
        if t[i] != '"':
            return "no"
        key, i, closed = _string(t, i)
        if not closed:
            return "maybe" if any(k.startswith(key) for k in _KEYS) else "no"
        if key not in _KEYS:
            return "no"
        if key not in ("name", "function"):
            return "maybe"
        i = _skip(t, i)
        if i < len(t) and t[i] != ":":
            return "no"
        i = _skip(t, i + 1)
        if i >= len(t) or (t[i] == "{" and key == "function"):
            return "maybe"
        if t[i] != '"':
            return "no"
        name, i, closed = _string(t, i)
        if closed:
            return "named" if name in self.names else "no"
        return "maybe" if any(n.startswith(name) for n in self.names) else "no"

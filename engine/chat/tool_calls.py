"""Tool calls in a model's own format: which format a chat template uses, and a streaming parser for it.

A model writes its calls as text in the format it was trained on, and its chat template says which
(the template renders earlier calls back into the prompt the same way):

- "hermes": `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per call (Qwen2.5,
  Qwen3, Hermes, SmolLM, and the fallback for templates that know no tools at all; the JSON may be
  fenced as ```json inside the tags);
- "llama3_json": the whole reply is `{"name": ..., "parameters": {...}}` (several joined by `;`),
  optionally after `<|python_tag|>` (Llama 3.1, 3.2, 3.3);
- "mistral": `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral v3 tokenizers);
- "mistral_args": `[TOOL_CALLS]name[ARGS]{...}` per call (Mistral Small 3.2, Magistral, Devstral);
- "phi4_mini": `functools[{"name": ..., "arguments": {...}}, ...]` (Phi-4-mini);
- "harmony": a commentary-channel message `to=functions.NAME` with the JSON arguments, ending in
  `<|call|>` (gpt-oss; read from the reply's channels by engine.chat.harmony_parser, not by the
  ToolCallParser below).

ToolCallParser takes the reply as it streams and hands out only text that can no longer turn out to be
part of a call (text that might be the start of a call marker is held back until it is decided), and
each call once it is complete, so a client never sees half a call as text. A complete region that is
not a valid call (broken JSON between two well-formed tags) is text after all and shown as such; a call
cut off by the end of the reply (max_tokens) is dropped, not shown.

It also hands out the calls as OpenAI (and vLLM) stream them (`take_pieces`): as soon as a region shows
a call's name, a first piece with the call's index, id and name; then its arguments object's text as
the model writes it. From that first piece on the region is a call: if it then fails to parse, the call
keeps the arguments text that was sent (and its text is never shown as content); a call cut off by the
end of the reply is still dropped from the calls (the stream showed its start, and finish_reason says
"length"). A call sent in pieces keeps the model's own arguments text, so the pieces add up to exactly
the arguments of the whole call; a call read whole has them re-serialised by json.dumps.
"""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from .harmony import CALL, CHANNEL, CONSTRAIN, MESSAGE, SPECIAL_TOKENS, START, uses_harmony
from .tool_call_pieces import LiveCall, ToolCallPiece

_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ToolCall:
    """One call: OpenAI's `tool_calls` entry (arguments_json is the arguments object as JSON text)."""

    id: str
    name: str
    arguments_json: str

    @property
    def arguments(self) -> dict:
        value = json.loads(self.arguments_json)
        return value if isinstance(value, dict) else {}

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}

    @classmethod
    def from_openai(cls, entry: dict) -> ToolCall:
        """From an OpenAI `tool_calls` entry (arguments as JSON text or as an object)."""
        fn = entry.get("function") or {}
        args = fn.get("arguments", "{}")
        return cls(str(entry.get("id") or ""), str(fn.get("name") or ""),
                   args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


@dataclass
class Scan:
    """What a format found at a call marker: `consumed` characters, and the calls there (None: not a
    call after all, show the text; []: an unfinished call, drop it)."""

    consumed: int
    calls: list[tuple[str, str]] | None


def _call_from_obj(obj, args_keys=("arguments", "parameters")) -> tuple[str, str] | None:
    """(name, arguments JSON) of a {"name": ..., "arguments": {...}} object, or None if it isn't one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def _calls_from_value(value) -> list[tuple[str, str]] | None:
    items = value if isinstance(value, list) else [value]
    calls = [_call_from_obj(v) for v in items]
    return calls if calls and all(calls) else None


def _decode(text: str) -> tuple[object, int] | str:
    """raw_decode of one JSON value at the start of `text` (after whitespace): (value, end) or
    "incomplete" (the text stops inside it) or "invalid"."""
    stripped = text.lstrip()
    offset = len(text) - len(stripped)
    try:
        value, end = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError as exc:
        tail = stripped[exc.pos:]
        truncated = (exc.msg.startswith("Unterminated") or any(w.startswith(tail) for w in ("true", "false", "null"))
                     or re.fullmatch(r"[-+0-9.eE]*", tail) is not None)
        return "incomplete" if truncated or not stripped else "invalid"
    return value, offset + end


_FENCED = re.compile(r"^```[A-Za-z_]*[ \t]*\n|\n```$")
# the start of a JSON call object, up to its arguments value (after the format's marker, maybe an array's "[")
_HEADER = re.compile(r'\s*\[?\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class ToolCallFormat:
    """One family's call syntax. `triggers` open a call anywhere in the reply, `start_triggers` only at
    its start (after whitespace); scan() reads the call region that starts at a trigger."""

    name = ""
    triggers: tuple[str, ...] = ()
    start_triggers: tuple[str, ...] = ()
    id_length = 24  # characters after "call_"

    def scan(self, text: str, final: bool) -> Scan | None:
        """`text` starts with a trigger; None: the region is not complete yet (never when final)."""
        raise NotImplementedError

    def render(self, calls: list[ToolCall]) -> str:
        """The calls as this format writes them (for templates that can't render `tool_calls` themselves)."""
        raise NotImplementedError

    def header(self, text: str) -> tuple[str, int] | None:
        """(name, where its arguments value starts) of the first call in an unfinished region, once the
        region shows both; None until then. JSON formats write `{"name": ..., "arguments": ` first (a
        region with the name after the arguments is only read whole)."""
        at = next((len(t) for t in self.triggers if text.startswith(t)), 0)
        m = _HEADER.match(text, at)
        if m is None:
            return None
        name = json.loads(m.group(1))
        return (name, m.end()) if name else None

    def new_id(self) -> str:
        return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(self.id_length))

    def parser(self, names: frozenset[str] | None = None) -> ToolCallParser:
        return ToolCallParser(self, names)

    @property
    def markers(self) -> tuple[str, ...]:
        """Strings of this format that may be single special tokens (decoded as text, used in grammars)."""
        return tuple(t for t in self.triggers if t.startswith(("<|", "[")))


class HermesFormat(ToolCallFormat):
    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"
    triggers = (START,)

    def scan(self, text: str, final: bool) -> Scan | None:
        end = text.find(self.END, len(self.START))
        if end < 0:
            if not final:
                return None
            decoded = _decode(text[len(self.START):])  # the model stopped without the closing tag
            calls = _calls_from_value(decoded[0]) if isinstance(decoded, tuple) else None
            return Scan(len(text), calls or [])
        inner = _FENCED.sub("", text[len(self.START):end].strip())  # some models fence the JSON inside the tags
        try:
            calls = _calls_from_value(json.loads(inner))
        except json.JSONDecodeError:
            calls = None
        return Scan(end + len(self.END), calls)

    def render(self, calls: list[ToolCall]) -> str:
        return "\n".join(f'{self.START}\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments_json}}}\n{self.END}'
                         for c in calls)


class Llama3JsonFormat(ToolCallFormat):
    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"
    triggers = (PYTHON_TAG,)
    start_triggers = ("{",)
    _CALL_START = '{"name":'

    def scan(self, text: str, final: bool) -> Scan | None:
        body = text[len(self.PYTHON_TAG):] if text.startswith(self.PYTHON_TAG) else text
        compact = re.sub(r"\s+", "", body)[:len(self._CALL_START)]
        if len(compact) < len(self._CALL_START):  # too short to tell yet; at the end: not a call
            looks_like_call = not final and self._CALL_START.startswith(compact)
        else:
            looks_like_call = compact == self._CALL_START
        if not looks_like_call:
            return Scan(len(text), None)  # plain JSON (or python) text, not a call
        if not final:
            return None  # calls run to the end of the reply
        calls, rest = [], body
        while rest.strip():
            decoded = _decode(rest)
            if not isinstance(decoded, tuple):
                return Scan(len(text), [] if decoded == "incomplete" else None)
            call = _call_from_obj(decoded[0], ("parameters", "arguments"))
            if call is None:
                return Scan(len(text), None)
            calls.append(call)
            rest = rest[decoded[1]:].lstrip()
            if rest.startswith(";"):
                rest = rest[1:]
        return Scan(len(text), calls)

    def render(self, calls: list[ToolCall]) -> str:
        return "; ".join(f'{{"name": {json.dumps(c.name)}, "parameters": {c.arguments_json}}}' for c in calls)


class ArrayFormat(ToolCallFormat):
    """A marker then a JSON array of {"name", "arguments"} objects (Mistral v3, Phi-4-mini)."""

    def __init__(self, name: str, trigger: str, id_length: int = 24):
        self.name, self.triggers, self.id_length = name, (trigger,), id_length
        # Phi-4-mini's trigger ends in the array's own bracket: the JSON starts at it
        self.skip = len(trigger) - 1 if trigger.endswith("[") else len(trigger)

    def scan(self, text: str, final: bool) -> Scan | None:
        decoded = _decode(text[self.skip:])
        if decoded == "incomplete":
            return Scan(len(text), []) if final else None
        if decoded == "invalid":
            return Scan(len(text), None)
        return Scan(self.skip + decoded[1], _calls_from_value(decoded[0]))

    def render(self, calls: list[ToolCall]) -> str:
        body = json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False)
        return self.triggers[0][:self.skip] + body

    def new_id(self) -> str:
        if self.id_length == 9:  # Mistral's templates insist on 9 alphanumeric characters
            return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))
        return super().new_id()


class MistralArgsFormat(ToolCallFormat):
    """`[TOOL_CALLS]name[ARGS]{...}` per call (also `name[CALL_ID]id[ARGS]{...}`)."""

    name = "mistral_args"
    TAG, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    triggers = (TAG,)
    id_length = 9

    def scan(self, text: str, final: bool) -> Scan | None:
        at = text.find(self.ARGS, len(self.TAG))
        if at < 0:
            return Scan(len(text), []) if final else None
        name = text[len(self.TAG):at].split(self.CALL_ID)[0].strip()
        decoded = _decode(text[at + len(self.ARGS):])
        if decoded == "incomplete":
            return Scan(len(text), []) if final else None
        if decoded == "invalid" or not name:
            return Scan(len(text), None)
        call = _call_from_obj({"name": name, "arguments": decoded[0]})
        return Scan(at + len(self.ARGS) + decoded[1], [call] if call else None)

    def render(self, calls: list[ToolCall]) -> str:
        return "".join(f"{self.TAG}{c.name}{self.ARGS}{c.arguments_json}" for c in calls)

    def header(self, text: str) -> tuple[str, int] | None:
        at = text.find(self.ARGS, len(self.TAG))
        name = text[len(self.TAG):at].split(self.CALL_ID)[0].strip() if at >= 0 else ""
        return (name, at + len(self.ARGS)) if name else None

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.TAG, self.ARGS, self.CALL_ID)

    new_id = ArrayFormat.new_id


class HarmonyFormat(ToolCallFormat):
    """gpt-oss's calls: harmony messages on the commentary channel (engine.chat.harmony)."""

    name = "harmony"

    def render(self, calls: list[ToolCall]) -> str:
        return "".join(f"{START}assistant{CHANNEL}commentary to=functions.{c.name} {CONSTRAIN}json{MESSAGE}"
                       f"{c.arguments_json}{CALL}" for c in calls)

    @property
    def markers(self) -> tuple[str, ...]:
        return SPECIAL_TOKENS


FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (
    HermesFormat(), Llama3JsonFormat(), ArrayFormat("mistral", "[TOOL_CALLS]", id_length=9),
    MistralArgsFormat(), ArrayFormat("phi4_mini", "functools["), HarmonyFormat())}


def tool_call_format(template: str | None) -> ToolCallFormat:
    """The call format a chat template's source implies; Hermes when it names none (the format most
    small models were tuned on, and the one the fallback tool prompt teaches)."""
    source = template or ""
    if uses_harmony(source):
        return FORMATS["harmony"]
    if "[TOOL_CALLS]" in source:
        return FORMATS["mistral_args" if "[ARGS]" in source else "mistral"]
    if "<|python_tag|>" in source or '"parameters": ' in source:
        return FORMATS["llama3_json"]
    if "functools" in source or "<|tool|>" in source:
        return FORMATS["phi4_mini"]
    return FORMATS["hermes"]


def _held_suffix(text: str, triggers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a trigger."""
    best = 0
    for t in triggers:
        for n in range(min(len(text), len(t) - 1), best, -1):
            if t.startswith(text[-n:]):
                best = n
                break
    return best


class ToolCallParser:
    """Streaming: feed() returns the content text that is safe to show; take_calls() the calls completed
    since the last take, take_pieces() the calls' streamed pieces; finish() ends the reply. `.content`
    and `.calls` hold everything so far.

    Whitespace between text and a call is dropped (it belongs to the call's layout); a reply with no
    calls keeps all of its text as it came.

    names: the offered functions, when known. A region opened by no marker (Llama's bare JSON at the
    reply's start) is a call only if it names them: unmarked, `{"name": "Bob", "age": 42}` is an answer.
    """

    def __init__(self, fmt: ToolCallFormat, names: frozenset[str] | None = None):
        self.fmt = fmt
        self.names = names
        self._unmarked = False  # the current region was opened by a start trigger
        self.content = ""
        self.calls: list[ToolCall] = []
        self._taken = 0
        self._buf = ""  # undecided text
        self._ws = ""  # whitespace held until we know whether a call follows it
        self._in_call = False
        self._at_start = True  # nothing but whitespace seen yet (start_triggers apply)
        self._pieces: list[ToolCallPiece] = []
        self._live: LiveCall | None = None  # the call the current region is streaming

    def feed(self, text: str) -> str:
        self._buf += text
        return self._run(final=False)

    def take_calls(self) -> list[ToolCall]:
        new = self.calls[self._taken:]
        self._taken = len(self.calls)
        return new

    def take_pieces(self) -> list[ToolCallPiece]:
        new, self._pieces = self._pieces, []
        return new

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The reply ended: returns the last content delta and the calls not yet taken."""
        out = self._run(final=True)
        if self._buf:  # held text that never became a trigger
            out += self._text(self._buf)
            self._buf = ""
        if self._ws and not self.calls:
            out += self._ws
            self.content += self._ws
        self._ws = ""
        return out, self.take_calls()

    def _text(self, text: str) -> str:
        """Hand out content: held whitespace is released by the next non-whitespace text."""
        body = text.rstrip()
        if not body:
            self._ws += text
            return ""
        out = self._ws + text[:len(body)]
        self._ws = text[len(body):]
        if self._at_start:
            self._at_start = False
        self.content += out
        return out

    def _run(self, final: bool) -> str:
        out = []
        while self._buf:
            if self._in_call:
                scan = self.fmt.scan(self._buf, final)
                if scan is None:
                    self._stream_call()
                    break
                region, self._buf = self._buf[:scan.consumed], self._buf[scan.consumed:]
                self._in_call = False
                if scan.calls and not self._offered(n for n, _ in scan.calls):
                    scan.calls = None
                if self._live is not None:
                    self._end_live(region, scan.calls)
                elif scan.calls is None:
                    out.append(self._text(region))
                else:
                    self._ws = ""
                    self._add([ToolCall(self.fmt.new_id(), n, a) for n, a in scan.calls])
                continue
            at, trigger = self._find_trigger()
            if at >= 0:
                out.append(self._text(self._buf[:at]))
                self._buf = self._buf[at:]
                self._in_call, self._at_start = True, False
                self._unmarked = trigger in self.fmt.start_triggers
                continue
            if self._at_start and not self._buf.strip():
                self._ws += self._buf  # leading whitespace: a start trigger may still come
                self._buf = ""
                break
            keep = 0 if final else self._hold()
            out.append(self._text(self._buf[:len(self._buf) - keep]))
            self._buf = self._buf[len(self._buf) - keep:]
            break
        return "".join(out)

    def _add(self, calls: list[ToolCall]) -> None:
        """Calls read whole: each is one piece."""
        for call in calls:
            self._pieces.append(ToolCallPiece(len(self.calls), call.arguments_json, call.id, call.name))
            self.calls.append(call)

    def _stream_call(self) -> None:
        """An unfinished region: its call's first piece once the name is there, then arguments text."""
        live = self._live
        if live is None:
            head = self.fmt.header(self._buf)
            if head is None or not self._offered([head[0]]):
                return
            live = self._live = LiveCall(len(self.calls), self.fmt.new_id(), *head)
            self._pieces.append(ToolCallPiece(live.index, "", live.id, live.name))
        more = live.advance(self._buf)
        if more:
            self._pieces.append(ToolCallPiece(live.index, more))

    def _offered(self, names) -> bool:
        """Whether a region's calls may name these functions (an unmarked one: only offered ones)."""
        return not self._unmarked or self.names is None or all(n in self.names for n in names)

    def _end_live(self, region: str, calls: list[tuple[str, str]] | None) -> None:
        """The streamed call's region is complete: the call keeps the arguments text it was sent (the
        whole arguments now, or, not streamable, the parsed ones in one piece); further calls of the
        region come whole. A call cut off by the reply's end ([]) is dropped."""
        live, self._live = self._live, None
        self._ws = ""
        more = live.advance(region)
        if more:
            self._pieces.append(ToolCallPiece(live.index, more))
        if calls == []:
            return
        arguments = live.sent(region)
        if not live.streamable or not arguments:
            arguments = calls[0][1] if calls else "{}"
            self._pieces.append(ToolCallPiece(live.index, arguments))
        self.calls.append(ToolCall(live.id, live.name, arguments))
        self._add([ToolCall(self.fmt.new_id(), n, a) for n, a in (calls or [])[1:]])

    def _find_trigger(self) -> tuple[int, str]:
        if self._at_start and self.fmt.start_triggers:
            stripped = self._buf.lstrip()
            for t in self.fmt.start_triggers:
                if stripped.startswith(t):
                    return len(self._buf) - len(stripped), t
        found = [(self._buf.find(t), t) for t in self.fmt.triggers if t in self._buf]
        return min(found) if found else (-1, "")

    def _hold(self) -> int:
        held = _held_suffix(self._buf, self.fmt.triggers)
        if self._at_start and self.fmt.start_triggers:
            stripped = self._buf.lstrip()
            if any(t.startswith(stripped) for t in self.fmt.start_triggers):
                held = max(held, len(self._buf))
        return held


def parse_tool_calls(text: str, fmt: ToolCallFormat) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole reply, exactly as streaming it through ToolCallParser gives."""
    parser = fmt.parser()
    parser.feed(text)
    parser.finish()
    return parser.content, parser.calls

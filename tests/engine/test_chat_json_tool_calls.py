"""engine.chat's plain JSON tool calls: the forms small models write instead of their format's markers
become calls when they name an offered function and end the reply; near misses stay text; streamed split
anywhere gives the same, and text is held back only while it may still be a call."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from engine.chat import FORMATS, ReplyParser, split_reply

NAMES = ("get_weather", "now")
PARIS = ("get_weather", {"city": "Paris"})
CODER = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'  # Qwen2.5-Coder 1.5B

# (the template's format, reply, expected content, expected [(name, arguments)])
CALLS = [
    ("hermes", CODER, "", [PARIS]),
    ("hermes", "I'll check the weather.\n\n" + CODER + "\n", "I'll check the weather.", [PARIS]),
    ("hermes", '{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),
    ("hermes", ' {"name": "get_weather", "parameters": {"city": "Paris"}}\n', "", [PARIS]),
    ("hermes", '{"function": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),
    ("hermes", '{"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}',
     "", [PARIS]),
    ("hermes", '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}}]',
     "", [PARIS, ("now", {})]),
    ("hermes", '```json\n{"name": "now", "arguments": {}}\n```\n```json\n{"name": "get_weather", "arguments": '
               '{"city": "Paris"}}\n```', "", [("now", {}), PARIS]),
    ("hermes", '{"name": "now", "arguments": {}}; {"name": "get_weather", "arguments": {"city": "Paris"}}',
     "", [("now", {}), PARIS]),
    ("hermes", '```tool_call\n{"name": "now", "arguments": {}}\n```', "", [("now", {})]),
    # the closing fence never came
    ("hermes", 'Calling it.\n```json\n{"name": "now", "arguments": {}}', "Calling it.", [("now", {})]),
    ("hermes", '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n```json\n{"name": "get_weather", '
               '"arguments": {"city": "Paris"}}\n```', "", [("now", {}), PARIS]),  # the format's call, then JSON
    ("hermes", '<tool_call>\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n</tool_call>',
     "", [PARIS]),  # the format's tags around a fenced block
    # Llama 3.2: its own format is `{"name", "parameters"}` at the start; it also writes these
    ("llama3_json", '<|python_tag|>{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}',
     "", [PARIS]),
    ("llama3_json", '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    ("llama3_json", 'Let me look that up. {"name": "get_weather", "parameters": {"city": "Paris"}}',
     "Let me look that up.", [PARIS]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
]

# replies that stay text as they are: each is close to a call, but no call
NEAR_MISSES = [
    '{"name": "get_time", "arguments": {}}',  # a function that is not offered
    '```json\n{"name": "get_time", "arguments": {}}\n```',
    '{"name": "Bob", "age": 42}',  # JSON data with a "name"
    '{"city": "Paris", "temperature": 18}',
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\nThis asks for the weather in Paris.',
    'Call it as {"name": "get_weather", "arguments": {"city": "Paris"}} and it answers.',
    '{"name": "get_weather", "description": "Current weather", "parameters": {"type": "object"}}',  # a schema
    '{"name": "get_weather"}',  # no arguments
    '{"name": "get_weather", "arguments": ["Paris"]}',  # arguments not an object
    '{"name": "get_weather", "function": "now", "arguments": {}}',  # two names
    '{"type": "object", "name": "get_weather", "arguments": {}}',
    '{"call": {"name": "get_weather", "arguments": {"city": "Paris"}}}',  # a call inside other JSON
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}, 3]',
    '```json\n[1, 2, 3]\n```',
    '```python\nprint({"name": "get_weather", "arguments": {}})\n```',
    'function f(x) { return {a: [x]}; }',
    "Use `now` or ``get_weather`` [see docs] <b>ok</b> <|python",
    '{"na',  # cut off before it named anything
    '```js\n',
    "{broken json} and more",
]


def _stream(reply: str, fmt: str, cuts: list[int], names=NAMES):
    parser = ReplyParser(tool_format=FORMATS[fmt], tool_names=names)
    shown, calls = [], []
    for a, b in zip([0, *cuts], [*cuts, len(reply)]):
        d = parser.feed(reply[a:b])
        shown.append(d.content)
        calls += d.tool_calls
    d = parser.finish()
    return "".join(shown) + d.content, [(c.name, c.arguments) for c in calls + d.tool_calls]


@pytest.mark.parametrize("fmt,reply,content,calls", CALLS)
def test_each_form_is_a_call(fmt, reply, content, calls):
    whole = split_reply(reply, tool_format=FORMATS[fmt], tool_names=NAMES)
    assert whole.content == content
    assert [(c.name, c.arguments) for c in whole.tool_calls] == calls
    ids = [c.id for c in whole.tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == len(ids)


# Llama's own format is bare `{"name": ..., "parameters"|"arguments": ...}` at the reply's start, whatever
# other keys it has (as vLLM's llama3_json parser reads it): only an unoffered name makes it text there.
LLAMA_OWN = [r for r in NEAR_MISSES if r.startswith('{"name": "get_weather"')]


@pytest.mark.parametrize("fmt,reply", [("hermes", r) for r in NEAR_MISSES]
                         + [("llama3_json", r) for r in NEAR_MISSES if r not in LLAMA_OWN])
def test_near_misses_stay_text(fmt, reply):
    whole = split_reply(reply, tool_format=FORMATS[fmt], tool_names=NAMES)
    assert (whole.content, whole.tool_calls) == (reply, [])


def test_llamas_own_bare_json_names_an_offered_function_or_is_text():
    for reply in ('{"name": "get_time", "parameters": {}}', '{"name": "Bob", "age": 42}'):
        assert split_reply(reply, tool_format=FORMATS["llama3_json"], tool_names=NAMES).tool_calls == []
        parser = ReplyParser(tool_format=FORMATS["llama3_json"], tool_names=NAMES)
        assert [parser.feed(ch).call_pieces for ch in reply] == [[]] * len(reply)  # no call was started
        assert parser.finish().content == reply
    # marked by <|python_tag|>, a call is a call whatever it names (the app tells the model it has no such tool)
    marked = split_reply('<|python_tag|>{"name": "get_time", "parameters": {}}', tool_format=FORMATS["llama3_json"],
                         tool_names=NAMES)
    assert [c.name for c in marked.tool_calls] == ["get_time"]


@pytest.mark.parametrize("fmt,reply,content,calls", CALLS + [("hermes", r, r, []) for r in NEAR_MISSES])
def test_streaming_split_at_every_boundary_gives_the_same(fmt, reply, content, calls):
    for i in range(len(reply) + 1):
        assert _stream(reply, fmt, [i]) == (content, calls), i


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(CALLS + [("hermes", r, r, []) for r in NEAR_MISSES]),
       cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=20))
def test_streaming_any_split_gives_the_same(case, cuts):
    fmt, reply, content, calls = case
    assert _stream(reply, fmt, sorted({min(c, len(reply)) for c in cuts})) == (content, calls)


def test_a_call_cut_off_by_the_end_is_dropped_once_it_named_an_offered_function():
    assert _stream('Sure. ```json\n{"name": "get_weather", "argu', "hermes", []) == ("Sure.", [])
    assert _stream('Sure. {"name": "get_we', "hermes", []) == ('Sure. {"name": "get_we', [])


def test_text_is_held_back_only_while_it_may_be_a_call():
    parser = ReplyParser(tool_format=FORMATS["hermes"], tool_names=NAMES)
    steps = [("Here: ", "Here:"), ("{", ""), ('"na', ""), ('me": "get_', ""),
             ('wind"', ' {"name": "get_wind"'),  # no offered function is called get_wind: text at once
             (', "x": 1} and ', ', "x": 1} and'), ("``", ""), ("`py", " ```py"),  # a fence, but not JSON's
             ("\n[", ""), ("1", "\n[1"), (" {", ""), ('"city"', ' {"city"'),  # no call has a "city" key
             (' ```json\n{"name": "now", "arguments": {}}\n```', ""), ("\n", ""),
             ("That was an example.", ' ```json\n{"name": "now", "arguments": {}}\n```\nThat was an example.')]
    for piece, shown in steps:
        assert parser.feed(piece).content == shown, piece
    d = parser.finish()
    assert (d.content, d.tool_calls) == ("", [])


def test_a_json_call_comes_whole_in_one_piece_after_the_formats_own_calls():
    reply = ('<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n'
             '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```')
    parser = ReplyParser(tool_format=FORMATS["hermes"], tool_names=NAMES)
    pieces = []
    for ch in reply:
        d = parser.feed(ch)
        pieces += d.call_pieces
        assert d.content == ""
    fed = len(pieces)
    last = parser.finish()
    pieces += last.call_pieces
    native, plain = parser.tool_calls
    assert [(p.index, p.name) for p in pieces[:fed] if p.name] == [(0, "now")]
    assert [(p.index, p.id, p.name, p.arguments) for p in last.call_pieces] == [
        (1, plain.id, "get_weather", '{"city": "Paris"}')]
    assert [c.name for c in last.tool_calls] == ["get_weather"] and plain.id != native.id


def test_only_the_first_call_without_parallel_calls():
    reply = '[{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Paris"}}]'
    whole = split_reply(reply, tool_format=FORMATS["hermes"], tool_names=NAMES, parallel=False)
    assert [c.name for c in whole.tool_calls] == ["now"]


@pytest.mark.parametrize("reply", [r for fmt, r, _, _ in CALLS if fmt == "hermes" and "<tool_call>" not in r])
def test_without_offered_tools_nothing_changes(reply):
    for fmt in (None, FORMATS["hermes"]):
        whole = split_reply(reply, tool_format=fmt)
        assert (whole.content, whole.tool_calls) == (reply, [])


def test_mistral_ids_for_plain_json_calls():
    whole = split_reply('{"name": "now", "arguments": {}}', tool_format=FORMATS["mistral"], tool_names=NAMES)
    (call,) = whole.tool_calls
    assert len(call.id) == 9 and call.id.isalnum()

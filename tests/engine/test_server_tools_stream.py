"""Tool calls stream as OpenAI and vLLM stream them, read by the official openai client.

The model is scripted (tests/scripted_models.py) to write a Hermes call in Qwen2.5's template over
several tokens: the call's name in one, then its arguments object in three. Streamed, the call must
come as a first `tool_calls` delta with index, id, type and name (arguments empty), then one delta per
arguments token carrying only the index and that text; the openai client's own stream accumulation
must give the same call as the non-streamed reply, and no part of the call may show as content.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from tests.scripted_models import write_scripted_model
from tests.server_support import ServerThread

pytestmark = pytest.mark.timeout(300)

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
PREFACE = "Checking."
ARGS = ['{"city": ', '"Paris", ', '"unit": "C"}']
SCRIPT = [PREFACE, "<tool_call>", '\n{"name": "get_weather", "arguments": ', *ARGS, "}\n", "</tool_call>"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = write_scripted_model(tmp_path_factory.mktemp("stream_calls") / "m", SCRIPT,
                                  (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text())
    with ServerThread(folder, cache_tokens=1024, page_size=16) as s:
        yield s


def _create(server, **kw):
    kw.setdefault("max_tokens", 40)
    return server.client().chat.completions.create(model=server.model_name, messages=QUESTION, tools=[WEATHER],
                                                   temperature=0, **kw)


def test_a_call_streams_as_its_name_then_its_arguments_in_pieces(server):
    whole = _create(server).choices[0]
    (call,) = whole.message.tool_calls
    assert whole.finish_reason == "tool_calls" and whole.message.content == PREFACE
    assert (call.function.name, call.function.arguments) == ("get_weather", "".join(ARGS))

    chunks = list(_create(server, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    first, *rest = deltas
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather")
    assert first.function.arguments == ""
    assert first.id and first.id.startswith("call_")
    assert [(d.index, d.id, d.type, d.function.name) for d in rest] == [(0, None, None, None)] * len(ARGS)
    assert [d.function.arguments for d in rest] == ARGS  # each arguments token as it was generated
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == PREFACE  # never a piece of the call as text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]

    state = ChatCompletionStreamState()  # the openai client's own accumulation of a stream
    for chunk in chunks:
        state.handle_chunk(chunk)
    final = state.get_final_completion().choices[0]
    (acc,) = final.message.tool_calls
    assert (acc.id, acc.function.name, acc.function.arguments) == (first.id, "get_weather", call.function.arguments)
    assert final.finish_reason == "tool_calls" and final.message.content == PREFACE


def test_the_clients_stream_helper_sees_argument_deltas_and_the_whole_call(server):
    client = server.client()
    with client.chat.completions.stream(model=server.model_name, messages=QUESTION, tools=[WEATHER],
                                        temperature=0, max_tokens=40) as stream:
        events = list(stream)
        final = stream.get_final_completion().choices[0]
    # (the first is the empty arguments of the delta that names the call)
    pieces = [e.arguments_delta for e in events if e.type == "tool_calls.function.arguments.delta"]
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert pieces == ["", *ARGS] and [(e.name, json.loads(e.arguments)) for e in done] == [
        ("get_weather", {"city": "Paris", "unit": "C"})]
    assert final.message.tool_calls[0].function.arguments == "".join(ARGS)


@pytest.mark.parametrize("cut", range(1, len(SCRIPT)))
def test_a_reply_cut_off_never_shows_its_call_as_text(server, cut):
    """max_tokens ends the reply after `cut` tokens. Streamed, a call whose name was written has started
    (its arguments so far follow, finish_reason "length"); not streamed, an unfinished call is dropped.
    Either way the call's text is never content."""
    whole = _create(server, max_tokens=cut).choices[0]
    chunks = list(_create(server, max_tokens=cut, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert content == (whole.message.content or "") == PREFACE
    complete = cut >= 4 + len(ARGS)  # the call's object is whole (only its closing tag may be missing)
    assert finish == [whole.finish_reason] == ["tool_calls" if complete else "length"]
    assert len(whole.message.tool_calls or []) == int(complete)
    written = min(len(ARGS), max(0, cut - 3))  # arguments tokens written
    expect = [] if cut < 3 else ["get_weather"] + [None] * written
    assert [d.function.name for d in deltas] == expect
    assert "".join(d.function.arguments or "" for d in deltas) == "".join(ARGS[:written])


@pytest.mark.parametrize("fmt, text", [
    ("hermes", 'On it. <tool_call>\n{"name": "add", "arguments": {"a": [1, 2], "s": "x}\\"]y"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'),
    ("llama3_json", '{"name": "add", "parameters": {"a": 2}}; {"name": "now", "parameters": {}}'),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "now", "arguments": {}}]'),
    ("mistral_args", '[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]now[ARGS]{}'),
    ("phi4_mini", 'functools[{"name": "add", "arguments": {"a": 1}}]'),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1}"}\n</tool_call>'),  # arguments as a string
])
def test_pieces_add_up_to_the_calls_of_the_whole_reply_in_every_format(fmt, text):
    """Fed one character at a time, each format's calls come as pieces (name first, then arguments) that
    add up to the calls the streaming parser keeps, and to the whole reply's calls read at once."""
    from engine.chat import FORMATS, ReplyParser, split_reply

    parser, pieces, content = ReplyParser(tool_format=FORMATS[fmt]), [], ""
    for ch in text:
        d = parser.feed(ch)
        pieces, content = pieces + d.call_pieces, content + d.content
    d = parser.finish()
    pieces, content = pieces + d.call_pieces, content + d.content
    calls: dict[int, list] = {}
    for p in pieces:
        if p.id is not None:
            assert p.index not in calls and p.name
            calls[p.index] = [p.id, p.name, ""]
        else:
            assert p.index in calls
        calls[p.index][2] += p.arguments
    assert [tuple(calls[i]) for i in sorted(calls)] == [(c.id, c.name, c.arguments_json) for c in parser.tool_calls]
    whole = split_reply(text, tool_format=FORMATS[fmt])
    assert content == whole.content and [(c.name, c.arguments) for c in parser.tool_calls] == [
        (c.name, c.arguments) for c in whole.tool_calls]
    assert len(parser.tool_calls) == (1 if fmt == "phi4_mini" or '"{' in text else 2)

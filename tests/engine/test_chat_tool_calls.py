"""engine.chat tool calls: every format parsed whole and streamed split anywhere, the format picked from
the real templates, the forcing grammar accepted by llguidance, and history rendered by each template."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from engine.chat import (
    FORMATS, THINK, ToolCall, parse_tool_calls, template_messages, tool_call_format, tool_choice_grammar,
)
from engine.chat.template_messages import render_kwargs

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now"}}

# (format, reply, expected content, expected [(name, arguments)])
CASES = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
     "Let me check.", [("get_weather", {"city": "Paris"}), ("now", {})]),
    ("hermes", '<tool_call>\n[{"name": "now", "arguments": "{}"}]\n</tool_call>', "", [("now", {})]),
    ("hermes", "x < y and a <tool b", "x < y and a <tool b", []),
    ("hermes", '<tool_call>\n{"name": "now", "arguments": {}}', "", [("now", {})]),  # no closing tag at the end
    ("hermes", '<tool_call>\n{"name": "get_weather", "argum', "", []),  # cut off: dropped, never shown
    ("hermes", "<tool_call>{broken}</tool_call> ok", "<tool_call>{broken}</tool_call> ok", []),  # whole, not a call
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "now", "parameters": {}}',
     "", [("get_weather", {"city": "Oslo"}), ("now", {})]),
    ("llama3_json", '<|python_tag|>{"name": "now", "parameters": {}}', "", [("now", {})]),
    ("llama3_json", '  {"answer": 42}', '  {"answer": 42}', []),
    ("llama3_json", 'The JSON is {"name": "x", "parameters": {}}', 'The JSON is {"name": "x", "parameters": {}}', []),
    ("llama3_json", '{"name": "now", "parameters": {"a": tr', "", []),
    ("mistral", 'Sure[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "now", "arguments": {}}]',
     "Sure", [("get_weather", {"city": "Rome"}), ("now", {})]),
    ("mistral", "[TOOL_CALLS][{\"name\": \"now\", \"argu", "", []),
    ("mistral_args", '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]now[CALL_ID]abcdefghi[ARGS]{}',
     "", [("get_weather", {"city": "Rome"}), ("now", {})]),
    ("phi4_mini", 'functools[{"name": "now", "arguments": {}}]', "", [("now", {})]),
    ("hermes", "no calls at all, just text\n", "no calls at all, just text\n", []),
]


def _stream(fmt, pieces):
    parser = fmt.parser()
    shown, calls = [], []
    for piece in pieces:
        shown.append(parser.feed(piece))
        calls += parser.take_calls()
    rest, last = parser.finish()
    return "".join(shown) + rest, calls + last


@pytest.mark.parametrize("fmt,reply,content,calls", CASES)
def test_whole_reply_parses(fmt, reply, content, calls):
    got_content, got_calls = parse_tool_calls(reply, FORMATS[fmt])
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    assert all(c.id for c in got_calls) and len({c.id for c in got_calls}) == len(got_calls)


@pytest.mark.parametrize("fmt,reply,content,calls", CASES)
def test_streaming_split_at_every_boundary_gives_the_same(fmt, reply, content, calls):
    for i in range(len(reply) + 1):
        got_content, got_calls = _stream(FORMATS[fmt], [reply[:i], reply[i:]])
        assert got_content == content, i
        assert [(c.name, c.arguments) for c in got_calls] == calls, i


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_streaming_any_split_gives_the_same(case, cuts):
    fmt, reply, content, calls = case
    points = sorted({min(c, len(reply)) for c in cuts})
    pieces = [reply[a:b] for a, b in zip([0, *points], [*points, len(reply)])]
    got_content, got_calls = _stream(FORMATS[fmt], pieces)
    assert (got_content, [(c.name, c.arguments) for c in got_calls]) == (content, calls)


def test_text_that_may_start_a_call_is_held_back_until_decided():
    parser = FORMATS["hermes"].parser()
    assert parser.feed("Hello <tool") == "Hello"  # the space too: it belongs to the call's layout if one comes
    assert parser.feed("_c") == ""
    assert parser.feed("hat with me") == " <tool_chat with me"
    assert parser.finish() == ("", [])


def test_each_call_is_handed_out_once_complete():
    parser = FORMATS["hermes"].parser()
    parser.feed('<tool_call>\n{"name": "now", "arguments": {}}\n</tool_ca')
    assert parser.take_calls() == []
    parser.feed('ll>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "A"}}\n</tool_call>')
    assert [c.name for c in parser.take_calls()] == ["now", "get_weather"]
    assert parser.finish() == ("", [])


def test_mistral_ids_are_nine_alphanumerics_and_openai_form_round_trips():
    _, calls = parse_tool_calls('[TOOL_CALLS][{"name": "now", "arguments": {}}]', FORMATS["mistral"])
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
    entry = calls[0].to_openai()
    assert entry == {"id": calls[0].id, "type": "function", "function": {"name": "now", "arguments": "{}"}}
    assert ToolCall.from_openai(entry) == calls[0]


@pytest.mark.parametrize("template,fmt", [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"), ("Qwen-Qwen3-0.6B.jinja", "hermes"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3_json"), ("google-gemma-3-4b-it.jinja", "hermes"),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "hermes"),
])
def test_format_is_read_off_the_template(template, fmt):
    assert tool_call_format((TEMPLATES / template).read_text()).name == fmt
    assert tool_call_format(None).name == "hermes"
    assert tool_call_format("{{ '[TOOL_CALLS]' }}{{ '[ARGS]' }}").name == "mistral_args"
    assert tool_call_format("{{ '[TOOL_CALLS]' }}").name == "mistral"


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abcdefghi", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "abcdefghi", "content": "18 C, sunny"},
    {"role": "tool", "tool_call_id": "abcdefghi", "content": "wind 5 km/h"},
]


@pytest.mark.parametrize("template", [None, "Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja",
                                      "meta-llama-Llama-3.2-3B-Instruct.jinja", "google-gemma-3-4b-it.jinja",
                                      "microsoft-Phi-3.5-mini-instruct.jinja"])
def test_tool_history_renders_through_each_template(template):
    """Tools, the call and both results reach the prompt, in the template's own way or the fallback's."""
    from engine.model.tokenizer import Tokenizer

    tok = Tokenizer.load()
    if template is not None:
        tok.chat_template = (TEMPLATES / template).read_text()
    source = tok.chat_template
    fmt = tool_call_format(source)
    messages = template_messages(HISTORY, source, fmt, [WEATHER])
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, **render_kwargs([WEATHER], source))
    assert "Current weather" in prompt  # the tool list
    assert "get_weather" in prompt.split("Weather in Paris?")[1]  # the earlier call, after the question
    assert prompt.index("18 C, sunny") < prompt.index("wind 5 km/h")
    assert '"{\\"city' not in prompt  # arguments rendered as an object, not JSON text quoted again
    assert HISTORY[1]["content"] is None  # the caller's messages are left alone


GRAMMAR_CASES = [
    ("hermes", "required", True, None, False,
     '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
     '"arguments": {"city": "Paris"}}\n</tool_call>'),
    ("hermes", "get_weather", True, THINK, False,
     '<think>\nhmm\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("hermes", "now", True, THINK, True, 'hmm</think>\n\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'),
    ("llama3_json", "required", True, None, False, '{"name": "now", "parameters": {}}; {"name": "now", "parameters": {}}'),
    ("mistral", "get_weather", False, None, False, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "R"}}]'),
    ("mistral_args", "required", True, None, False, '[TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]now[ARGS]{}'),
    ("phi4_mini", "now", True, None, False, 'functools[{"name": "now", "arguments": {}}]'),
]


def _matcher(grammar: str):
    import llguidance

    from engine.generator.filters import llg_tokenizer
    from tests.tiny_models import default_tokenizer

    tok = default_tokenizer()
    return tok, llguidance.LLMatcher(llg_tokenizer(tok), llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)


@pytest.mark.parametrize("fmt,choice,parallel,markers,in_reasoning,reply", GRAMMAR_CASES)
def test_forcing_grammar_accepts_the_format_and_the_parser_reads_it(fmt, choice, parallel, markers, in_reasoning,
                                                                     reply):
    grammar = tool_choice_grammar(FORMATS[fmt], [WEATHER, NOW], choice, parallel=parallel, reasoning=markers,
                                  in_reasoning=in_reasoning)
    tok, m = _matcher(grammar)
    assert m.consume_tokens(tok.encode(reply)[0].tolist()), m.get_error()
    assert m.is_accepting()
    body = reply
    if markers is not None:
        from engine.chat import split_reasoning

        _, body = split_reasoning(reply, markers, in_reasoning=in_reasoning)
    _, calls = parse_tool_calls(body, FORMATS[fmt])
    assert calls and all(c.name in ("now", "get_weather") for c in calls)


@pytest.mark.parametrize("reply", [
    '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',  # another function than the named one
    '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',  # a required argument missing
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}}\n</tool_call>',  # the wrong type
    "I would rather not.",
])
def test_forcing_grammar_refuses_anything_but_a_valid_call_of_the_named_function(reply):
    tok, m = _matcher(tool_choice_grammar(FORMATS["hermes"], [WEATHER, NOW], "get_weather"))
    assert not (m.consume_tokens(tok.encode(reply)[0].tolist()) and m.is_accepting())


def test_one_call_only_when_parallel_calls_are_off():
    one = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    tok, m = _matcher(tool_choice_grammar(FORMATS["hermes"], [NOW], "required", parallel=False))
    assert m.consume_tokens(tok.encode(one)[0].tolist()) and m.is_accepting()
    assert not m.consume_tokens(tok.encode("\n<tool_call>")[0].tolist())


def test_special_token_markers_are_named_by_id():
    grammar = tool_choice_grammar(FORMATS["mistral"], [NOW], "now", special_tokens={"[TOOL_CALLS]": 9})
    assert "<[9]>" in grammar and '"[TOOL_CALLS]"' not in grammar
    assert json.dumps("now") in grammar
    with pytest.raises(ValueError, match="not in tools"):
        tool_choice_grammar(FORMATS["hermes"], [NOW], "missing")

"""Harmony (gpt-oss): which models use it, the prompt pagedeck renders, and the reply read by its channels
(streamed piece by piece or whole, the same parts)."""
from __future__ import annotations

import json

import pytest

from engine.chat import ReplyParser, split_reply
from engine.chat.harmony import check_reasoning_effort, uses_harmony
from engine.chat.harmony_render import render_harmony
from engine.chat.reasoning import HARMONY, reasoning_markers, split_reasoning
from engine.chat.tool_calls import FORMATS, tool_call_format
from engine.model.chat_format import decide
from tests.harmony_models import TEMPLATE, WEATHER_TOOL, answer_model

ANSWER_REPLY = ("<|channel|>analysis<|message|>The user says hi.<|end|>"
                "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?")
CALL_REPLY = ('<|channel|>analysis<|message|>Need the weather.<|end|>'
              '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
              '{"city": "Paris"}')


def stream(text: str, *, tools: bool = True, parallel: bool = True, step: int = 1):
    """The reply fed `step` characters at a time: the parser and every delta it handed out."""
    parser = ReplyParser(HARMONY, tool_format=FORMATS["harmony"] if tools else None, parallel=parallel)
    deltas = [parser.feed(text[i:i + step]) for i in range(0, len(text), step)] + [parser.finish()]
    return parser, deltas


def test_a_harmony_template_or_vocabulary_picks_harmony_and_its_parsers():
    assert uses_harmony(TEMPLATE) and not uses_harmony("{{ '<|im_start|>' }}")
    assert reasoning_markers(TEMPLATE) is HARMONY and tool_call_format(TEMPLATE).name == "harmony"
    harmony_vocab = {"<|start|>", "<|end|>", "<|channel|>", "<|message|>", "<|return|>", "<|call|>"}
    fmt = decide(None, harmony_vocab.__contains__)  # no template: the vocabulary's special tokens say it
    assert fmt.harmony and "vocabulary" in fmt.label
    assert decide(TEMPLATE, lambda t: False).harmony  # the template says it
    assert decide(TEMPLATE, lambda t: False, choice="model").kind == "model"  # the user can still pick the template
    assert not decide(None, {"<|im_start|>", "<|im_end|>"}.__contains__).harmony


def test_the_prompt_has_the_effort_the_tools_and_the_turn_s_calls_and_results():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "Need the weather.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    text = render_harmony(messages, tools=[WEATHER_TOOL], reasoning_effort="high", current_date="2026-01-02")
    assert text.startswith("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                           "Knowledge cutoff: 2024-06\nCurrent date: 2026-01-02\n\nReasoning: high\n\n"
                           "# Valid channels: analysis, commentary, final. Channel must be included for every message."
                           "\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>")
    assert ("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
            "namespace functions {\n\n// The weather in a city now.\ntype get_weather = (_: {\n// The city\n"
            "city: string,\n}) => any;\n\n} // namespace functions<|end|>") in text
    assert text.endswith("<|start|>user<|message|>Weather in Paris?<|end|>"
                         "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
                         "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
                         '<|message|>{"city": "Paris"}<|call|>'
                         "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>"
                         "<|start|>assistant")
    # an answered turn keeps its answer on the final channel and drops its thinking
    later = render_harmony(messages + [{"role": "assistant", "content": "Sunny.", "reasoning_content": "Easy."},
                                       {"role": "user", "content": "Thanks"}], tools=[WEATHER_TOOL])
    assert "<|start|>assistant<|channel|>final<|message|>Sunny.<|end|>" in later
    assert "Need the weather." not in later and "Easy." not in later
    assert "Reasoning: medium" in later  # the default effort


def test_a_bad_reasoning_effort_is_refused_by_name():
    with pytest.raises(ValueError, match="reasoning_effort must be one of low, medium, high, got 'max'"):
        render_harmony([{"role": "user", "content": "hi"}], reasoning_effort="max")
    assert check_reasoning_effort("low") == "low"


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_the_reply_s_channels_are_thinking_and_answer_streamed_or_whole(step):
    parser, deltas = stream(ANSWER_REPLY, step=step)
    assert (parser.reasoning, parser.content, parser.tool_calls) == ("The user says hi.", "Hello! How can I help?", [])
    assert not any("<|" in d.content or "<|" in d.reasoning for d in deltas)  # never a piece of a special token
    assert split_reasoning(ANSWER_REPLY, HARMONY) == ("The user says hi.", "Hello! How can I help?")
    whole = split_reply(ANSWER_REPLY, HARMONY)
    assert (whole.reasoning, whole.content) == (parser.reasoning, parser.content)


def test_a_commentary_call_is_a_tool_call_streamed_as_openai_streams_calls():
    parser, deltas = stream(CALL_REPLY)
    (call,) = parser.tool_calls
    assert (call.name, json.loads(call.arguments_json), parser.reasoning, parser.content) == (
        "get_weather", {"city": "Paris"}, "Need the weather.", "")
    pieces = [p for d in deltas for p in d.call_pieces]
    assert pieces[0].to_openai() == {"index": 0, "id": call.id, "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}
    assert len(pieces) > 3 and "".join(p.arguments for p in pieces) == call.arguments_json  # as written
    # a preamble (commentary to no one) is answer text; the recipient may stand before the channel
    text = ("<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant to=functions.get_weather"
            '<|channel|>commentary <|constrain|>json<|message|>{"city": "Oslo"}')
    reply = split_reply(text, HARMONY, tool_format=FORMATS["harmony"])
    assert reply.content == "Let me look." and [c.name for c in reply.tool_calls] == ["get_weather"]
    # without tools the calls are not kept, and never shown as text
    parser, _ = stream(CALL_REPLY, tools=False)
    assert parser.tool_calls == [] and parser.content == ""


def test_a_second_call_is_dropped_when_calls_are_not_parallel_and_plain_text_stays_text():
    two = CALL_REPLY + "<|end|><|start|>assistant<|channel|>commentary to=functions.get_time <|message|>{}"
    assert [c.name for c in stream(two)[0].tool_calls] == ["get_weather", "get_time"]
    assert [c.name for c in stream(two, parallel=False)[0].tool_calls] == ["get_weather"]
    plain = "Just an answer,\nwith no header."
    parser, _ = stream(plain)
    assert (parser.reasoning, parser.content) == ("", plain)


def test_a_harmony_vocabulary_stops_at_return_and_call_but_not_at_end(tmp_path):
    from engine import Tokenizer

    tok = Tokenizer.load(answer_model(tmp_path / "m"))
    ids = {t: tok.token_to_id(t) for t in ("<|end|>", "<|return|>", "<|call|>")}
    assert ids["<|return|>"] in tok.stop_token_ids and ids["<|call|>"] in tok.stop_token_ids
    assert ids["<|end|>"] not in tok.stop_token_ids  # it ends the thinking message, then the answer comes
    assert tok.chat_format.harmony
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], reasoning_effort="low")
    assert "Reasoning: low" in prompt and prompt.endswith("<|start|>assistant")


@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_a_forced_choice_s_grammar_takes_one_harmony_call_and_the_parser_reads_it(tmp_path, choice):
    import llguidance

    from engine import Tokenizer
    from engine.chat import tool_choice_grammar
    from engine.generator.filters import llg_tokenizer

    tok = Tokenizer.load(answer_model(tmp_path / "m"))
    fmt = FORMATS["harmony"]
    special = {m: tok.token_to_id(m) for m in fmt.markers}
    grammar = tool_choice_grammar(fmt, [WEATHER_TOOL], choice, special_tokens=special, reasoning=HARMONY)

    def accepts(text: str) -> bool:
        m = llguidance.LLMatcher(llg_tokenizer(tok), llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
        return m.consume_tokens(tok.encode(text, encode_special_tokens=True)[0].tolist()) and m.is_accepting()

    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    assert accepts(call)
    assert not accepts('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"town": 1}')
    assert not accepts("<|channel|>final<|message|>No.")
    (parsed,) = split_reply(call, HARMONY, tool_format=fmt).tool_calls
    assert (parsed.name, json.loads(parsed.arguments_json)) == ("get_weather", {"city": "Paris"})

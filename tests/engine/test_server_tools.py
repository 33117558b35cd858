"""Tool calls and reasoning over the OpenAI API, with the official openai client against a live server.

Two tiny models: a random one with Qwen2.5's template (calls only come out when the tool choice forces
them by grammar), and a scripted one with Qwen3's template that really thinks and writes a call in
its own format, so auto parsing, reasoning and cut-off calls are tested on what a model wrote.
"""
from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.scripted_models import write_scripted_model
from tests.server_support import ServerThread
from tests.tiny_models import write_tiny_model

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time"}}
QUESTION = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Weather in Paris?"}]
THOUGHT = "The user wants the weather."
SCRIPT = ["<think>", f"\n{THOUGHT}\n", "</think>", "\n\n", "<tool_call>",
          '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', "</tool_call>"]


@pytest.fixture(scope="module")
def random_server(tmp_path_factory):
    folder = write_tiny_model(tmp_path_factory.mktemp("qwen25") / "m", "qwen2")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with ServerThread(folder) as server:
        yield server


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    folder = write_scripted_model(tmp_path_factory.mktemp("qwen3") / "m", SCRIPT,
                                  (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    with ServerThread(folder) as server:
        yield server


def _ask(server, messages, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 80)
    return server.client().chat.completions.create(model=server.model_name, messages=messages, **kw)


def _collect(stream):
    """Reassemble a streamed reply: (reasoning, content, calls as (id, name, arguments), finish_reason)."""
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += tc.id or ""
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    return reasoning, content, [calls[i] for i in sorted(calls)], finish


def _valid_weather_args(arguments: str) -> dict:
    args = json.loads(arguments)
    assert set(args) <= {"city", "unit"} and args["city"] in ("Paris", "Oslo")
    assert args.get("unit", "C") in ("C", "F")
    return args


# ---- forced calls on a random model -------------------------------------------------------------------
def test_agent_loop_named_choice_then_the_result_then_an_answer(random_server):
    """Turn 1 must call get_weather (grammar); turn 2 sends the call and its result back and gets text,
    rendered exactly as transformers renders the same history with the same template."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = _ask(random_server, QUESTION, tools=[WEATHER, CLOCK], tool_choice=named)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    _valid_weather_args(call.function.arguments)

    history = QUESTION + [choice.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'}]
    second = _ask(random_server, history, tools=[WEATHER, CLOCK], tool_choice="auto", max_tokens=8,
                  logit_bias=_no_call_bias(random_server))
    answer = second.choices[0]
    assert not answer.message.tool_calls and answer.message.content
    assert second.usage.prompt_tokens == len(_transformers_prompt_ids(random_server, history, [WEATHER, CLOCK]))


def _no_call_bias(server):
    """logit_bias that keeps a random model from writing '<' (so an auto reply is plain text)."""
    tok = server.served.tokenizer
    return {str(i): -100 for i in range(tok.vocab_size) if tok.pieces[i].lstrip().startswith("<")}


def _transformers_prompt_ids(server, history, tools):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(server.served.tokenizer.source)
    messages = json.loads(json.dumps(history))
    for m in messages:  # what transformers' templates take: arguments as an object, content a string
        m["content"] = m.get("content") or ""
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    text = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return server.served.tokenizer.encode(text, encode_special_tokens=True)[0].tolist()


@pytest.mark.parametrize("parallel", [True, False])
def test_required_choice_always_gives_valid_calls_streamed_or_not(random_server, parallel):
    kw = dict(tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=parallel, max_tokens=120)
    whole = _ask(random_server, QUESTION, **kw).choices[0]
    assert whole.finish_reason in ("tool_calls", "length")
    calls = whole.message.tool_calls
    assert calls and (parallel or len(calls) == 1)
    for c in calls:
        assert c.function.name in ("get_weather", "now")
        if c.function.name == "get_weather":
            _valid_weather_args(c.function.arguments)
        else:
            assert json.loads(c.function.arguments) == {}
    reasoning, content, streamed, finish = _collect(_ask(random_server, QUESTION, stream=True, **kw))
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c.function.name, c.function.arguments) for c in calls]
    assert all(c["id"] for c in streamed) and content == "" and reasoning == "" and finish == whole.finish_reason


def test_tool_choice_none_never_calls(random_server):
    for stream in (False, True):
        reply = _ask(random_server, QUESTION, tools=[WEATHER], tool_choice="none", max_tokens=12, stream=stream)
        if stream:
            _, content, calls, finish = _collect(reply)
        else:
            msg = reply.choices[0].message
            content, calls, finish = msg.content, msg.tool_calls, reply.choices[0].finish_reason
        assert not calls and content and finish != "tool_calls"


@pytest.mark.parametrize("body,param", [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "now"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"messages": [{"role": "tool", "content": "18 C"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
])
def test_bad_tool_requests_are_400s_naming_the_field(random_server, body, param):
    extra = dict(body)
    messages = extra.pop("messages", QUESTION)
    with pytest.raises(openai.BadRequestError) as err:
        random_server.client().chat.completions.create(model=random_server.model_name, messages=messages,
                                                       max_tokens=4, extra_body=extra)
    assert err.value.body["param"] == param


# ---- a model that thinks and calls in its own format -----------------------------------------------------
def test_auto_call_and_reasoning_from_the_models_own_text(thinking_server):
    reply = _ask(thinking_server, QUESTION, tools=[WEATHER]).choices[0]
    assert reply.finish_reason == "tool_calls"
    assert reply.message.reasoning_content == THOUGHT and reply.message.content is None
    (call,) = reply.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})

    reasoning, content, calls, finish = _collect(_ask(thinking_server, QUESTION, tools=[WEATHER], stream=True))
    assert (reasoning, content, finish) == (THOUGHT, "", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", call.function.arguments)]


def test_streamed_deltas_keep_reasoning_and_content_apart(thinking_server):
    """Without tools the call is text; the thinking streams as reasoning_content deltas, never as content."""
    chunks = list(_ask(thinking_server, QUESTION, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert any(getattr(d, "reasoning_content", None) for d in deltas)
    assert all(not (getattr(d, "reasoning_content", None) and d.content) for d in deltas)
    reasoning, content, calls, finish = _collect(iter(chunks))
    whole = _ask(thinking_server, QUESTION).choices[0].message
    assert (reasoning, content) == (whole.reasoning_content, whole.content) == (THOUGHT, "".join(SCRIPT[4:]))
    assert not calls and finish == "stop"


def test_raw_text_when_reasoning_is_not_wanted_and_thinking_switch(thinking_server):
    raw = _ask(thinking_server, QUESTION, tools=[WEATHER], extra_body={"include_reasoning": False}).choices[0]
    assert raw.message.content == "".join(SCRIPT[:3]) and not getattr(raw.message, "reasoning_content", None)
    assert raw.message.tool_calls[0].function.name == "get_weather"
    # enable_thinking=false makes Qwen3's template close the think block in the prompt: no thinking
    off = _ask(thinking_server, QUESTION, tools=[WEATHER], extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.reasoning_content is None and off.choices[0].finish_reason == "tool_calls"
    assert off.usage.completion_tokens < _ask(thinking_server, QUESTION, tools=[WEATHER]).usage.completion_tokens


@pytest.mark.parametrize("cut", range(1, len(SCRIPT)))
def test_a_reply_cut_inside_a_call_never_shows_half_of_it(thinking_server, cut):
    """max_tokens ends the reply after `cut` script tokens: whatever part of the call was written stays
    hidden (auto), streamed or not, until its arguments are whole; the thinking so far is reasoning."""
    whole = _ask(thinking_server, QUESTION, tools=[WEATHER], max_tokens=cut).choices[0]
    _, content, calls, finish = _collect(_ask(thinking_server, QUESTION, tools=[WEATHER], max_tokens=cut, stream=True))
    for text in (whole.message.content or "", content):
        assert "<tool" not in text and "get_weather" not in text and "{" not in text
    if cut < 6:
        assert whole.finish_reason == finish == "length" and not whole.message.tool_calls and not calls
    else:  # the arguments are whole, only the closing tag is missing: that is a call
        assert whole.finish_reason == finish == "tool_calls" and len(whole.message.tool_calls) == len(calls) == 1
    assert (whole.message.reasoning_content or "") == (THOUGHT if cut >= 2 else "")


def test_thinking_history_and_tool_results_reach_the_template(thinking_server):
    """The call, its result and the earlier reasoning go back through Qwen3's own template."""
    first = _ask(thinking_server, QUESTION, tools=[WEATHER]).choices[0].message
    history = QUESTION + [first.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "18 C"}]
    prompt_tokens = _ask(thinking_server, history, tools=[WEATHER], max_tokens=1).usage.prompt_tokens
    expected = _transformers_prompt_ids(thinking_server, history, [WEATHER])
    assert prompt_tokens == len(expected)
    hf_text = thinking_server.served.tokenizer.decode(expected, decode_special_tokens=True)
    assert THOUGHT in hf_text and "<tool_response>\n18 C\n</tool_response>" in hf_text


# ---- the real default model ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_agent_loop_on_the_default_model():
    """SmolLM2 (its template knows no tools: the fallback prompt carries them) calls the named tool with
    valid arguments, streamed and not, gets the result back and answers in text."""
    with ServerThread(None, cache_tokens=8192, page_size=256) as server:
        named = {"type": "function", "function": {"name": "get_weather"}}
        first = _ask(server, QUESTION, tools=[WEATHER, CLOCK], tool_choice=named).choices[0]
        (call,) = first.message.tool_calls
        assert first.finish_reason == "tool_calls" and call.function.name == "get_weather"
        assert _valid_weather_args(call.function.arguments)["city"] == "Paris"
        _, content, streamed, finish = _collect(_ask(server, QUESTION, tools=[WEATHER, CLOCK], tool_choice=named,
                                                     stream=True))
        assert [(c["name"], c["arguments"]) for c in streamed] == [("get_weather", call.function.arguments)]
        assert finish == "tool_calls" and content == ""
        history = QUESTION + [first.message.model_dump(exclude_none=True),
                              {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
        answer = _ask(server, history, tools=[WEATHER, CLOCK], tool_choice="none", max_tokens=40).choices[0]
        assert answer.message.content and not answer.message.tool_calls

"""A harmony model (gpt-oss's format) behind the real OpenAI-compatible server, called with the official
openai client: the analysis channel is `reasoning_content`, the final channel `content`, a commentary
call `tool_calls` (streamed and not), and `reasoning_effort` is checked and reaches the harmony system
message. The models are tiny scripted harmony models (tests/harmony_models.py)."""
from __future__ import annotations

import json

import openai
import pytest

from engine.server.requests import parse_request
from tests.harmony_models import (
    ANSWER, CALL_ARGUMENTS, CALL_THOUGHT, THOUGHT, WEATHER_TOOL, answer_model, call_model,
)
from tests.server_support import ServerThread

pytestmark = pytest.mark.timeout(300)
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def answering(tmp_path_factory):
    with ServerThread(answer_model(tmp_path_factory.mktemp("harmony") / "answer"), cache_tokens=2048) as server:
        yield server


@pytest.fixture(scope="module")
def calling(tmp_path_factory):
    with ServerThread(call_model(tmp_path_factory.mktemp("harmony") / "call"), cache_tokens=2048) as server:
        yield server


def test_the_analysis_channel_is_reasoning_content_and_the_final_channel_content(answering):
    client = answering.client()
    r = client.chat.completions.create(model=answering.model_name, messages=HI, max_tokens=40, temperature=0)
    message = r.choices[0].message
    assert (message.content, message.reasoning_content, r.choices[0].finish_reason) == (ANSWER, THOUGHT, "stop")
    chunks = list(client.chat.completions.create(model=answering.model_name, messages=HI, max_tokens=40,
                                                 temperature=0, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == (THOUGHT, ANSWER)
    assert not any("<|" in (d.content or "") for d in deltas)  # no special token ever reaches the client
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_commentary_call_is_a_tool_call(calling):
    client = calling.client()
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model=calling.model_name, messages=asked, tools=[WEATHER_TOOL],
                                       max_tokens=40, temperature=0)
    choice = r.choices[0]
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert (choice.message.content, choice.message.reasoning_content, choice.finish_reason) == (
        None, CALL_THOUGHT, "tool_calls")
    chunks = list(client.chat.completions.create(model=calling.model_name, messages=asked, tools=[WEATHER_TOOL],
                                                 max_tokens=40, temperature=0, stream=True))
    pieces = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or ()]
    assert pieces[0].id and pieces[0].function.name == "get_weather" and pieces[0].index == 0
    assert "".join(p.function.arguments or "" for p in pieces) == CALL_ARGUMENTS
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the call and its result go back as harmony messages: the next request is rendered and answered
    history = asked + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                       {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    again = client.chat.completions.create(model=calling.model_name, messages=history, tools=[WEATHER_TOOL],
                                           max_tokens=40, temperature=0)
    assert again.choices[0].message.tool_calls[0].function.name == "get_weather"
    prompt = parse_request("chat", {"messages": history, "tools": [WEATHER_TOOL]}, calling.served, None).prompt
    assert ('to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
            "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>") in prompt


def test_reasoning_effort_is_checked_and_reaches_the_harmony_system_message(answering):
    client = answering.client()
    r = client.chat.completions.create(model=answering.model_name, messages=HI, max_tokens=40, temperature=0,
                                       reasoning_effort="high")
    assert r.choices[0].message.content == ANSWER
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=answering.model_name, messages=HI, max_tokens=4,
                                       extra_body={"reasoning_effort": "extreme"})
    assert bad.value.body["param"] == "reasoning_effort" and "low, medium, high" in bad.value.body["message"]
    for effort in ("low", "high"):  # the prompt the server renders for such a request
        req = parse_request("chat", {"messages": HI, "reasoning_effort": effort}, answering.served, None)
        assert f"Reasoning: {effort}\n" in req.prompt and "Reasoning: medium" not in req.prompt
    assert "Reasoning: medium\n" in parse_request("chat", {"messages": HI}, answering.served, None).prompt


def test_a_required_tool_choice_forces_one_harmony_call(calling):
    r = calling.client().chat.completions.create(
        model=calling.model_name, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=40, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.reasoning_content is None


def test_a_harmony_vocabulary_without_a_template_is_served_as_harmony(tmp_path):
    from tests.harmony_models import THINK_THEN_ANSWER, write_harmony_model

    model = write_harmony_model(tmp_path / "bare", THINK_THEN_ANSWER, template=None)
    with ServerThread(model, cache_tokens=2048) as server:
        assert server.served.tokenizer.chat_template is None and server.served.tokenizer.chat_format.harmony
        r = server.client().chat.completions.create(model=server.model_name, messages=HI, max_tokens=40,
                                                    temperature=0)
        assert (r.choices[0].message.reasoning_content, r.choices[0].message.content) == (THOUGHT, ANSWER)
        prompt = parse_request("chat", {"messages": HI, "tools": [WEATHER_TOOL]}, server.served, None).prompt
        assert "type get_weather = (_: {" in prompt and "<tools>" not in prompt

"""Tool calls written as plain JSON, as small models really write them, over the API with the official
openai client.

Each model is scripted (tests/scripted_models.py): a real transformers model whose greedy reply is one
of the forms, token by token, under its real chat template: Qwen2.5-Coder's fenced ```json block (its
template asks for <tool_call> tags), bare JSON after some text, a list of `{"function": ...}` calls,
Llama 3.2's `<|python_tag|>{"type": "function", ...}` and `{"type": "function", "function": {...}}`. Each
must come back as `tool_calls` (finish_reason "tool_calls"), whole or streamed, and streamed no part of
the JSON may show as content. JSON that names a function the request did not offer stays content.
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
QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"
LLAMA = "meta-llama-Llama-3.2-3B-Instruct.jinja"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time"}}
QUESTION = [{"role": "user", "content": "What's the weather like in Paris right now? Use the tool."}]
PARIS = ("get_weather", {"city": "Paris"})

# id: (template, the prompt's last token, the script, content, calls)
CASES = {
    "coder_fenced_json": (QWEN, "\n", ["```json\n", '{\n  "name": "get_weather",\n',
                                       '  "arguments": {\n    "city": "Paris"\n  }\n}\n', "```"], "", [PARIS]),
    "text_then_bare_json": (QWEN, "\n", ["Let me check.", '\n{"name": "get_weather", "arguments": ',
                                         '{"city": "Paris"}}'], "Let me check.", [PARIS]),
    "list_of_function_calls": (QWEN, "\n", ['[{"function": "get_weather", "parameters": {"city": "Paris"}}, ',
                                            '{"function": "now", "arguments": {}}]'], "", [PARIS, ("now", {})]),
    "llama_python_tag": (LLAMA, "\n\n", ["<|python_tag|>", '{"type": "function", "name": "get_weather", ',
                                         '"parameters": {"city": "Paris"}}'], "", [PARIS]),
    "llama_type_function": (LLAMA, "\n\n", ['{"type": "function", "function": {"name": "get_weather", ',
                                            '"arguments": {"city": "Paris"}}}'], "", [PARIS]),
    "json_naming_no_offered_tool": (QWEN, "\n", ["```json\n", '{"name": "get_time", "arguments": {}}', "\n```"],
                                    '```json\n{"name": "get_time", "arguments": {}}\n```', []),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    template, start, script, content, calls = CASES[request.param]
    folder = write_scripted_model(tmp_path_factory.mktemp("json_calls") / "m", script,
                                  (TEMPLATES / template).read_text(), start=start)
    with ServerThread(folder, cache_tokens=1024, page_size=16) as server:
        yield server, "".join(script), content, calls


def _create(server, **kw):
    return server.client().chat.completions.create(model=server.model_name, messages=QUESTION, tools=[WEATHER, NOW],
                                                   tool_choice="auto", temperature=0, max_tokens=60, **kw)


def test_the_reply_is_the_scripted_form(case):
    """(the scripted model really writes the form: asked without tools, the reply is the JSON as text)"""
    server, reply, _, _ = case
    plain = server.client().chat.completions.create(model=server.model_name, messages=QUESTION, temperature=0,
                                                    max_tokens=60).choices[0]
    assert plain.message.content == reply and plain.message.tool_calls is None


def test_a_json_call_is_a_tool_call(case):
    server, reply, content, calls = case
    choice = _create(server).choices[0]
    got = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or ()]
    assert got == calls
    assert choice.message.content == (content or (None if calls else ""))
    assert choice.finish_reason == ("tool_calls" if calls else "stop")
    assert all(c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls or ())


def test_a_streamed_json_call_comes_as_tool_call_deltas_never_as_content(case):
    server, reply, content, calls = case
    chunks = list(_create(server, stream=True))
    shown = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(shown) == content
    if calls:
        assert not any('"name"' in s or "```" in s or "{" in s for s in shown)  # no piece of the JSON, ever
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert [(d.index, d.function.name) for d in deltas] == [(i, name) for i, (name, _) in enumerate(calls)]
    state = ChatCompletionStreamState()  # the openai client's own accumulation of the stream
    for chunk in chunks:
        state.handle_chunk(chunk)
    final = state.get_final_completion().choices[0]
    got = [(c.function.name, json.loads(c.function.arguments)) for c in final.message.tool_calls or ()]
    assert got == calls and final.finish_reason == ("tool_calls" if calls else "stop")
    assert len({c.id for c in final.message.tool_calls or ()}) == len(calls)

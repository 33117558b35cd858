"""The request schemas in /openapi.json and the server's request checks say the same thing.

Each row of VIOLATIONS breaks one rule the server enforces (a type, a range, an enum, a required field,
fields that go together or exclude each other, a string's length, an array's size, a model name): the
server answers a 400 (404 for an unknown model) whose `param` names the field, and the schema served at
/openapi.json refuses the same body. Each row of ACCEPTED is a body at the edge of a rule that both take.
A check added without its schema, or a schema rule the server does not apply, fails here.
"""
from __future__ import annotations

import json
import urllib.request

import jsonschema
import pytest

from engine.server.request_schemas import below_pattern
from tests.engine.test_server import post
from tests.server_support import ServerThread

USER = [{"role": "user", "content": "hi"}]
CHAT = {"messages": USER, "max_tokens": 2}
COMPLETION = {"prompt": "hi", "max_tokens": 2}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CONTEXT = 512  # the tiny model's max_position_embeddings
VOCAB = "vocab"  # stands for the tokenizer's vocabulary size in a row

# (endpoint, fields over the base body, the param the 400 names, status)
VIOLATIONS = [
    ("chat", {"messages": []}, "messages", 400),
    ("chat", {"messages": "hi"}, "messages", 400),
    ("chat", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", 400),
    ("chat", {"messages": [{"role": "user"}]}, "messages[0].content", 400),
    ("chat", {"messages": [{"role": "user", "content": None}]}, "messages[0].content", 400),
    ("chat", {"messages": [{"role": "user", "content": "hi", "colour": "red"}]}, "messages[0]", 400),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content", 400),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]}]},
     "messages[0].content", 400),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "messages[0].content[0]", 400),  # the tiny model reads text only: the schema has no image parts
    ("chat", {"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages[0].name", 400),
    ("chat", {"messages": [{"role": "tool", "content": "sunny"}]}, "messages[0].tool_call_id", 400),
    ("chat", {"messages": [{"role": "user", "content": "hi", "tool_call_id": "c1"}]}, "messages[0].tool_call_id", 400),
    ("chat", {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}, "messages[0].tool_calls", 400),
    ("chat", {"messages": [{"role": "assistant", "content": None}]}, "messages[0].content", 400),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"type": "web", "function": {"name": "f"}}]}]},
     "messages[0].tool_calls", 400),
    ("chat", {"messages": [{"role": "user", "content": "hi", "reasoning_content": "hm"}]},
     "messages[0].reasoning_content", 400),
    ("chat", {"tools": [{"type": "retrieval"}]}, "tools[0]", 400),
    ("chat", {"tools": [{**TOOL, "function": {"name": "get weather!"}}]}, "tools[0].function.name", 400),
    ("chat", {"tools": [{**TOOL, "function": {"name": "f", "strict": "yes"}}]}, "tools[0].function.strict", 400),
    ("chat", {"tools": [{**TOOL, "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters", 400),
    ("chat", {"tool_choice": "sometimes", "tools": [TOOL]}, "tool_choice", 400),
    ("chat", {"tool_choice": "auto"}, "tool_choice", 400),
    ("chat", {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice", 400),
    ("chat", {"tool_choice": "required", "tools": [TOOL], "response_format": {"type": "json_object"}},
     "response_format", 400),
    ("chat", {"parallel_tool_calls": 1}, "parallel_tool_calls", 400),
    ("chat", {"include_reasoning": "no"}, "include_reasoning", 400),
    ("chat", {"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", 400),
    ("chat", {"logprobs": "yes"}, "logprobs", 400),
    ("chat", {"top_logprobs": 2}, "top_logprobs", 400),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", 400),
    ("chat", {"max_completion_tokens": 0}, "max_completion_tokens", 400),
    ("chat", {"max_tokens": 2, "max_completion_tokens": CONTEXT}, "max_completion_tokens", 400),
    ("chat", {"max_tokens": CONTEXT, "max_completion_tokens": 2}, "max_tokens", 400),
    ("chat", {"model": "no-such-model"}, "model", 404),
    ("chat", {"model": 5}, "model", 400),
    ("chat", {"max_tokens": 0}, "max_tokens", 400),
    ("chat", {"max_tokens": 2.5}, "max_tokens", 400),
    ("chat", {"min_tokens": -1}, "min_tokens", 400),
    ("chat", {"temperature": 2.5}, "temperature", 400),
    ("chat", {"temperature": "hot"}, "temperature", 400),
    ("chat", {"top_p": 0}, "top_p", 400),
    ("chat", {"top_k": -2}, "top_k", 400),
    ("chat", {"min_p": 1.5}, "min_p", 400),
    ("chat", {"repetition_penalty": 0}, "repetition_penalty", 400),
    ("chat", {"presence_penalty": 3}, "presence_penalty", 400),
    ("chat", {"frequency_penalty": -3}, "frequency_penalty", 400),
    ("chat", {"seed": -1}, "seed", 400),
    ("chat", {"seed": 2**63}, "seed", 400),
    ("chat", {"n": 0}, "n", 400),
    ("chat", {"n": 33}, "n", 400),
    ("chat", {"priority": 1.5}, "priority", 400),
    ("chat", {"stop": [""]}, "stop", 400),
    ("chat", {"stop": 5}, "stop", 400),
    ("chat", {"stream": "yes"}, "stream", 400),
    ("chat", {"stream_options": {"include_usage": True}}, "stream_options", 400),
    ("chat", {"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage", 400),
    ("chat", {"stream": True, "stream_options": {"usage": True}}, "stream_options", 400),
    ("chat", {"logit_bias": {"abc": 1}}, "logit_bias", 400),
    ("chat", {"logit_bias": {"05": 1}}, "logit_bias", 400),
    ("chat", {"logit_bias": {VOCAB: 1}}, "logit_bias", 400),
    ("chat", {"logit_bias": {"5": 500}}, "logit_bias", 400),
    ("chat", {"user": 5}, "user", 400),
    ("chat", {"response_format": {"type": "xml"}}, "response_format", 400),
    ("chat", {"response_format": {"type": "text", "json_schema": {"schema": {}}}}, "response_format", 400),
    ("chat", {"response_format": {"type": "json_schema"}}, "response_format", 400),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "name": 5}}},
     "response_format.json_schema", 400),
    ("chat", {"ignore_eos": "no"}, "ignore_eos", 400),
    ("chat", {"ttl": -1}, "ttl", 400),
    ("chat", {"keep_alive": "five minutes"}, "keep_alive", 400),
    ("chat", {"ttl": 5, "keep_alive": "5m"}, "keep_alive", 400),
    ("chat", {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", 400),
    ("chat", {"truncate_prompt_tokens": CONTEXT + 1}, "truncate_prompt_tokens", 400),
    ("chat", {"colour": "red"}, "colour", 400),
    ("completion", {"prompt": ""}, "prompt", 400),
    ("completion", {"prompt": []}, "prompt", 400),
    ("completion", {"prompt": [VOCAB]}, "prompt", 400),
    ("completion", {"prompt": [-1]}, "prompt", 400),
    ("completion", {"prompt": ["a", "b"]}, "prompt", 400),
    ("completion", {"prompt": [["a"]]}, "prompt", 400),
    ("completion", {"logprobs": 21}, "logprobs", 400),
    ("completion", {"logprobs": True}, "logprobs", 400),
    ("completion", {"echo": True, "logprobs": 2}, "echo", 400),
    ("completion", {"best_of": 2}, "best_of", 400),
    ("completion", {"suffix": "z"}, "suffix", 400),
    ("completion", {"messages": USER}, "messages", 400),
]

# Bodies at the edge of a rule: the schema and the server both take them.
ACCEPTED = [
    ("chat", {}),
    ("chat", {"model": "ada"}),
    ("chat", {"max_tokens": 2.0, "n": 2.0, "seed": 3.0, "top_k": -1, "priority": -5}),  # integral numbers
    ("chat", {"max_tokens": 4, "max_completion_tokens": 2, "min_tokens": 2}),
    ("chat", {"logprobs": True, "top_logprobs": 20, "temperature": 2, "top_p": 1, "min_p": 0}),
    ("chat", {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": None}}),
    ("chat", {"messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]}, *USER]}),
    ("chat", {"messages": [*USER, {"role": "assistant", "content": None, "reasoning_content": "hm",
                                   "tool_calls": [{"id": "c1", "type": "function",
                                                   "function": {"name": "get_weather", "arguments": "{}"}}]},
                           {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]}),
    ("chat", {"tools": [TOOL], "tool_choice": "none", "response_format": {"type": "json_object"}}),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "strict": True, "schema": {"type": "object"}}}}),
    ("chat", {"logit_bias": {"0": -100, "7": 100}, "stop": "x", "user": "u1", "ignore_eos": False}),
    ("chat", {"keep_alive": "1h30m"}),
    ("chat", {"ttl": 0, "keep_alive": None}),
    ("completion", {}),
    ("completion", {"prompt": [1, 2.0, 3]}),
    ("completion", {"prompt": [[1, 2]], "logprobs": 20, "echo": False}),
    ("completion", {"prompt": ["hi"], "best_of": 1, "suffix": None, "model": "ada"}),
    ("completion", {"truncate_prompt_tokens": CONTEXT}),
]


@pytest.fixture(scope="module")
def server(tiny_llama_folder, tmp_path_factory):
    from tests.engine.test_lora import write_peft_adapter

    ada = write_peft_adapter(tiny_llama_folder, tmp_path_factory.mktemp("schema-lora") / "ada", seed=5)
    with ServerThread(tiny_llama_folder, adapters={"ada": ada}) as s:
        yield s


@pytest.fixture(scope="module")
def validators(server):
    with urllib.request.urlopen(server.url + "/openapi.json", timeout=60) as r:
        spec = json.loads(r.read())
    return {kind: jsonschema.Draft202012Validator({**spec, "$ref": f"#/components/schemas/{name}"})
            for kind, name in (("chat", "ChatCompletionRequest"), ("completion", "CompletionRequest"))}


def body_of(kind: str, fields: dict, vocab: int) -> dict:
    """The base body with `fields` over it, VOCAB made the vocabulary size (a token id just outside it)."""
    def fill(x):
        if isinstance(x, dict):
            return {(str(vocab) if k == VOCAB else k): fill(v) for k, v in x.items()}
        if isinstance(x, list):
            return [fill(v) for v in x]
        return vocab if x == VOCAB else x

    return fill({**(CHAT if kind == "chat" else COMPLETION), **fields})


def send(server, kind: str, body: dict) -> tuple[int, dict | str]:
    return post(server.url + ("/v1/chat/completions" if kind == "chat" else "/v1/completions"), body)


@pytest.mark.parametrize("kind,fields,param,status", VIOLATIONS,
                         ids=[f"{k}-{json.dumps(f)[:60]}" for k, f, _, _ in VIOLATIONS])
def test_a_broken_rule_is_refused_by_the_server_naming_the_field_and_by_the_schema(server, validators, kind, fields,
                                                                                    param, status):
    body = body_of(kind, fields, server.served.tokenizer.vocab_size)
    got, reply = send(server, kind, body)
    assert got == status, reply
    assert reply["error"]["param"] == param, reply
    assert not validators[kind].is_valid(body), f"the schema takes {body}, which the server refuses: {reply}"


@pytest.mark.parametrize("kind,fields", ACCEPTED, ids=[f"{k}-{json.dumps(f)[:60]}" for k, f in ACCEPTED])
def test_a_body_at_the_edge_of_a_rule_is_taken_by_both(server, validators, kind, fields):
    body = body_of(kind, fields, server.served.tokenizer.vocab_size)
    errors = [e.message for e in validators[kind].iter_errors(body)]
    assert not errors, errors
    got, reply = send(server, kind, body)
    assert got == 200, reply


def test_the_schema_names_what_the_server_serves(server, validators):
    spec = validators["chat"].schema
    chat = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert chat["model"]["anyOf"][0]["enum"] == [server.model_name, "ada"]
    assert chat["max_tokens"]["anyOf"][0]["maximum"] == CONTEXT - 1
    path = spec["paths"]["/v1/models/{model}"]["get"]["parameters"][0]
    assert path["schema"]["enum"] == [server.model_name, "ada"]
    for name in (server.model_name, "ada"):
        with urllib.request.urlopen(f"{server.url}/v1/models/{name}", timeout=60) as r:
            assert json.loads(r.read())["id"] == name


@pytest.mark.parametrize("n", [1, 2, 9, 10, 11, 100, 101, 999, 1000, 32000, 49152, 151936])
def test_below_pattern_matches_exactly_the_token_ids_below_n(n):
    import re

    pattern = re.compile(below_pattern(n))
    probe = set(range(0, min(n, 2000))) | set(range(max(0, n - 2000), n + 2000)) | {10 * n, n * n}
    assert {k for k in probe if pattern.match(str(k))} == {k for k in probe if k < n}
    assert not any(pattern.match(s) for s in ("", "-1", "01", "+1", " 1", "1.0", "１"))

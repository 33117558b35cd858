"""vLLM's truncate_prompt_tokens on /v1/chat/completions and /v1/completions, with the official openai client.

A prompt longer than the model's context is a 400 naming both lengths; with truncate_prompt_tokens=k the
server keeps the prompt's last k tokens (after the chat template), and the reply equals the engine's own
greedy run of exactly those ids, with usage counting k prompt tokens. Bad values are 400s naming the field,
and the OpenAPI schema states the field on both operations.
"""
from __future__ import annotations

import openai
import pytest

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from tests.engine.test_server import post
from tests.server_support import ServerThread

pytestmark = pytest.mark.timeout(300)
N_NEW = 8


@pytest.fixture(scope="module")
def server(tiny_llama_folder):
    with ServerThread(tiny_llama_folder) as s:
        yield s


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder):
    return Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)


def greedy(tiny, ids: list[int], stops: list) -> str:
    """The engine's greedy continuation of exactly these prompt ids, run alone: the oracle."""
    model, tok = tiny
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), tok)
    gen.enqueue(DynamicJob(gen_ids(ids), N_NEW, gen_settings=SamplerSettings.greedy(), stop_conditions=stops))
    text = ""
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                text += r["text"]
    return text


def gen_ids(ids: list[int]):
    import torch

    return torch.tensor([ids], dtype=torch.long)


def long_chat(words: int) -> list[dict]:
    return [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "first " + "alpha beta " * words},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and the capital of France?"}]


def test_a_chat_longer_than_the_context_is_a_400_naming_both_lengths_or_keeps_its_last_tokens(server, tiny):
    _, tok = tiny
    client, limit = server.client(), server.served.max_seq_len
    messages = long_chat(400)
    full = tok.encode(tok.apply_chat_template(messages), encode_special_tokens=True)[0].tolist()
    assert len(full) > limit
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=server.model_name, messages=messages, max_tokens=N_NEW)
    body = err.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "messages"
    assert f"maximum context length is {limit} tokens" in body["message"]
    assert f"your prompt has {len(full)} tokens" in body["message"]

    k = 100
    r = client.chat.completions.create(model=server.model_name, messages=messages, max_tokens=N_NEW, temperature=0,
                                       extra_body={"truncate_prompt_tokens": k, "ignore_eos": True})
    assert r.usage.prompt_tokens == k
    assert r.choices[0].message.content == greedy(tiny, full[-k:], [])  # exactly the last k ids, nothing else

    short = [{"role": "user", "content": "Hi"}]  # shorter than k: the whole prompt
    r = client.chat.completions.create(model=server.model_name, messages=short, max_tokens=2,
                                       extra_body={"truncate_prompt_tokens": k})
    assert r.usage.prompt_tokens == len(tok.encode(tok.apply_chat_template(short), encode_special_tokens=True)[0])


def test_a_completion_keeps_its_last_tokens_and_echoes_what_it_kept(server, tiny):
    _, tok = tiny
    client, limit = server.client(), server.served.max_seq_len
    ids = tok.encode("once upon a time " * 200, add_bos=tok.add_bos)[0].tolist()
    assert len(ids) > limit
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {limit} tokens"):
        client.completions.create(model=server.model_name, prompt=ids, max_tokens=N_NEW)
    k = 60
    r = client.completions.create(model=server.model_name, prompt=ids, max_tokens=N_NEW, temperature=0, echo=True,
                                  extra_body={"truncate_prompt_tokens": k, "ignore_eos": True})
    kept = tok.decode(ids[-k:], decode_special_tokens=True)
    assert r.usage.prompt_tokens == k
    assert r.choices[0].text == kept + greedy(tiny, ids[-k:], [])
    r = client.completions.create(model=server.model_name, prompt=ids, max_tokens=N_NEW, temperature=0,
                                  extra_body={"truncate_prompt_tokens": limit - N_NEW})  # fills the context exactly
    assert r.usage.prompt_tokens + r.usage.completion_tokens <= limit


def test_truncate_prompt_tokens_is_null_or_an_integer_within_the_context(server):
    limit = server.served.max_seq_len
    for path, body in [("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})]:
        for bad in [0, -1, "5", 1.5, True, [3], limit + 1]:
            status, reply = post(server.url + path, {**body, "truncate_prompt_tokens": bad, "max_tokens": 2})
            assert status == 400, (path, bad, reply)
            err = reply["error"]
            assert err["param"] == "truncate_prompt_tokens" and "truncate_prompt_tokens" in err["message"], err
        for good in [None, 1, 7, limit]:
            status, reply = post(server.url + path, {**body, "truncate_prompt_tokens": good, "max_tokens": 2})
            assert status == 200, (path, good, reply)
            assert good is None or reply["usage"]["prompt_tokens"] <= good


def test_the_openapi_schema_states_the_field_on_both_operations(server):
    import json
    import urllib.request

    with urllib.request.urlopen(server.url + "/openapi.json", timeout=60) as resp:
        spec = json.loads(resp.read())
    for path in ("/v1/chat/completions", "/v1/completions"):
        schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        if "$ref" in schema:
            schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        field = json.dumps(schema["properties"]["truncate_prompt_tokens"])
        assert '"minimum": 1' in field and '"null"' in field, field

"""The OpenAI-compatible server over real HTTP with the official `openai` client (tiny random model).

Oracles: a greedy API reply must equal the engine's own greedy run of the same chat-templated prompt,
logprobs must equal transformers' log-softmax of the same model, and a schema-constrained reply must
parse and fit the schema. Raw SSE is read off the socket to check the wire format clients rely on.
"""
from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

import openai
import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from tests.server_support import ServerThread, metric

pytestmark = pytest.mark.timeout(300)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder):
    return Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)


@pytest.fixture(scope="module")
def server(tiny_llama_folder):
    with ServerThread(tiny_llama_folder) as s:
        yield s


def solo(tiny, messages=None, n=16, prompt=None, stops=None, loras=None) -> tuple[str, list[int]]:
    """The engine's greedy completion of a chat (or a raw prompt) run alone: the oracle."""
    model, tok = tiny
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), tok)
    gen.set_loras(loras)
    try:
        if prompt is None:
            ids = tok.encode(tok.apply_chat_template(messages), encode_special_tokens=True)
            stops = sorted(tok.stop_token_ids) if stops is None else stops
        else:
            ids = tok.encode(prompt)
            stops = [tok.eos_token_id] if stops is None else stops
        gen.enqueue(DynamicJob(ids, n, gen_settings=SamplerSettings.greedy(), stop_conditions=stops))
        text, tokens = "", []
        while gen.num_remaining_jobs():
            for r in gen.iterate():
                if r["stage"] == "streaming":
                    text += r["text"]
                    tokens += r["token_ids"]
        return text, tokens
    finally:
        gen.set_loras(None)


def post(url: str, body, key: str | None = None) -> tuple[int, dict | str]:
    """POST raw bytes or JSON; returns (status, parsed JSON or text) without raising on 4xx/5xx."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                           **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw.decode()


def sse_events(server: ServerThread, path: str, body: dict) -> list[str]:
    """The `data:` payloads of a streamed response, read line by line off the socket."""
    conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=120)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    events = []
    for line in resp:
        line = line.decode().rstrip("\n")
        if line.startswith("data: "):
            events.append(line[6:])
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    conn.close()
    return events


# ---------------------------------------------------------------------------------- endpoints
def test_models_health_and_no_model_503(server, tiny_llama_folder):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [server.model_name]
    assert models.data[0].owned_by == "pagedeck"
    with urllib.request.urlopen(server.url + "/health") as r:
        assert r.status == 200
    with ServerThread(tiny_llama_folder, serve_model=False) as empty:
        status, body = post(empty.url + "/v1/chat/completions", {"messages": QUESTION})
        assert status == 503 and "no model is loaded" in body["error"]["message"]
        with pytest.raises(openai.InternalServerError, match="no model is loaded"):
            empty.client().models.list()


def test_chat_greedy_equals_the_engine_and_counts_usage(server, tiny):
    r = server.client().chat.completions.create(model=server.model_name, messages=QUESTION, temperature=0,
                                                max_tokens=16)
    text, tokens = solo(tiny, QUESTION, 16)
    assert r.choices[0].message.content == text and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == ("length" if len(tokens) == 16 else "stop")
    prompt_len = tiny[1].encode(tiny[1].apply_chat_template(QUESTION), encode_special_tokens=True).shape[1]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (prompt_len, len(tokens))
    assert r.usage.total_tokens == prompt_len + len(tokens) and r.id.startswith("chatcmpl-")
    assert r.model == server.model_name and r.object == "chat.completion"


def test_stream_with_the_openai_client_matches_the_whole_reply(server):
    client = server.client()
    whole = client.chat.completions.create(messages=QUESTION, model=server.model_name, temperature=0,
                                           max_tokens=20)
    chunks = list(client.chat.completions.create(messages=QUESTION, model=server.model_name, temperature=0,
                                                 max_tokens=20, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_raw_sse_wire_format(server):
    body = {"model": server.model_name, "messages": QUESTION, "max_tokens": 12, "temperature": 0, "stream": True}
    events = sse_events(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert all(c["usage"] is None for c in chunks[:-1])
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:-1])
    plain = [json.loads(e) for e in sse_events(server, "/v1/chat/completions", body)[:-1]]
    assert all("usage" not in c for c in plain)  # no include_usage: no usage key at all
    completion = [json.loads(e) for e in sse_events(server, "/v1/completions", {
        "model": server.model_name, "prompt": "Once upon", "max_tokens": 5, "stream": True, "temperature": 0})[:-1]]
    assert {c["object"] for c in completion} == {"text_completion"} and completion[-1]["choices"][0]["finish_reason"]


def test_completions_echo_stop_and_token_prompt(server, tiny):
    client = server.client()
    text, _ = solo(tiny, prompt="Once upon a time", n=24)
    r = client.completions.create(model=server.model_name, prompt="Once upon a time", max_tokens=24, temperature=0)
    assert r.choices[0].text == text and r.object == "text_completion"
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut = client.completions.create(model=server.model_name, prompt="Once upon a time", max_tokens=24,
                                    temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    echo = client.completions.create(model=server.model_name, prompt="Once upon a time", max_tokens=4,
                                     temperature=0, echo=True)
    assert echo.choices[0].text.startswith("Once upon a time") and echo.choices[0].text[16:] == text[: len(echo.choices[0].text) - 16]
    ids = tiny[1].encode("Once upon a time")[0].tolist()
    by_ids = client.completions.create(model=server.model_name, prompt=ids, max_tokens=24, temperature=0)
    assert by_ids.choices[0].text == text and by_ids.usage.prompt_tokens == len(ids)


def test_seed_makes_sampling_reproducible(server):
    client = server.client()

    def sample(seed):
        return client.chat.completions.create(model=server.model_name, messages=QUESTION, max_tokens=12,
                                              temperature=1.0, seed=seed).choices[0].message.content

    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(4)}) > 1  # a random 49k-vocab model: four seeds never all agree


def test_logprobs_are_the_models_distribution(server, tiny_llama_folder, tiny):
    from transformers import AutoModelForCausalLM

    r = server.client().chat.completions.create(model=server.model_name, messages=QUESTION, temperature=0,
                                                max_tokens=3, logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 3
    tok = tiny[1]
    id_of = {}
    for i in range(tok.vocab_size):
        id_of.setdefault(tok.token_bytes(i), i)
    ids = tok.encode(tok.apply_chat_template(QUESTION), encode_special_tokens=True)
    generated = torch.tensor([[id_of[bytes(c.bytes)] for c in content]])
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_folder, dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.cat([ids, generated], dim=1)).logits[0, ids.shape[1] - 1: ids.shape[1] + 2]
    lp = torch.log_softmax(logits.float(), dim=-1)
    for i, entry in enumerate(content):
        top = torch.topk(lp[i], 5)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(top.values.tolist(), abs=2e-3)
        assert [id_of[bytes(t.bytes)] for t in entry.top_logprobs] == top.indices.tolist()
        assert entry.logprob == pytest.approx(float(top.values[0]), abs=2e-3)  # greedy took the top token
        assert entry.token == tok.token_bytes(int(top.indices[0])).decode("utf-8", errors="replace")


def test_json_schema_response_format(server):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    r = server.client().chat.completions.create(
        model=server.model_name, messages=QUESTION, max_tokens=60, temperature=0.7, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    data = json.loads(r.choices[0].message.content)
    assert set(data) == {"city", "population"} and isinstance(data["city"], str) and len(data["city"]) <= 12
    assert isinstance(data["population"], int) and r.choices[0].finish_reason == "stop"


# ---------------------------------------------------------------------------------- bad input
BAD = [
    (b"{not json", 400, "not valid JSON"),
    ([1, 2], 400, "JSON object"),
    ({"messages": QUESTION, "model": "no-such-model"}, 404, "does not exist"),
    ({"messages": QUESTION, "n": 0}, 400, "n must be an integer from 1 to 32"),
    ({"messages": QUESTION, "temperature": -1}, 400, "temperature"),
    ({"messages": QUESTION, "temperature": 2.5}, 400, "temperature"),
    ({"messages": QUESTION, "temperature": "hot"}, 400, "temperature must be a number"),
    ({"messages": QUESTION, "top_p": 0}, 400, "top_p"),
    ({"messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": QUESTION, "max_tokens": 100000}, 400, "maximum context length"),
    ({"messages": [{"role": "user", "content": "word " * 600}]}, 400, "maximum context length"),
    ({"messages": []}, 400, "messages must be a non-empty list"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role 'wizard'"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400, "cannot see images"),
    ({"messages": QUESTION, "tools": [{"type": "function"}]}, 400, "tools[0] must be"),
    ({"messages": QUESTION, "stream_options": {"include_usage": True}}, 400, "only allowed when stream"),
    ({"messages": QUESTION, "logit_bias": {"abc": 1}}, 400, "not a token id"),
    ({"messages": QUESTION, "logit_bias": {"5": 500}}, 400, "[-100, 100]"),
    ({"messages": QUESTION, "top_logprobs": 3}, 400, "needs logprobs"),
    ({"messages": QUESTION, "seed": -4}, 400, "seed"),
    ({"messages": QUESTION, "stop": [""]}, 400, "stop must be"),
    ({"messages": QUESTION, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
     400, "schema"),
    ({"messages": QUESTION, "min_tokens": 50, "max_tokens": 10}, 400, "min_tokens"),
]


@pytest.mark.parametrize("body,status,message", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_input_gets_an_openai_error_and_nothing_breaks(server, body, status, message):
    got, reply = post(server.url + "/v1/chat/completions", body)
    assert got == status, reply
    err = reply["error"]
    assert message in err["message"] and err["type"] == "invalid_request_error" and set(err) == {
        "message", "type", "param", "code"}
    m = server.snapshot()
    assert m["active_jobs"] == m["pending_jobs"] == m["pages_referenced"] == 0
    ok = server.client().chat.completions.create(model=server.model_name, messages=QUESTION, max_tokens=2)
    assert ok.usage.completion_tokens == 2


def test_completion_bad_input_and_unknown_route(server):
    assert post(server.url + "/v1/completions", {"prompt": ["a", "b"]})[0] == 400
    assert post(server.url + "/v1/completions", {"prompt": [["a"]]})[0] == 400  # nested: token ids only
    assert post(server.url + "/v1/completions", {"prompt": "a", "suffix": "z"})[0] == 400
    assert post(server.url + "/v1/completions", {"prompt": [10**9]})[0] == 400
    status, body = post(server.url + "/v1/no-such-route", {})
    assert status == 404 and body["error"]["message"].startswith("no route")
    with pytest.raises(openai.BadRequestError, match="echo with logprobs"):
        server.client().completions.create(model=server.model_name, prompt="a", echo=True, logprobs=2)


def test_api_key_is_required_when_set(tiny_llama_folder):
    with ServerThread(tiny_llama_folder, api_key="s3cret") as s:
        with pytest.raises(openai.AuthenticationError, match="Incorrect API key"):
            s.client(api_key="wrong").models.list()
        status, body = post(s.url + "/v1/chat/completions", {"messages": QUESTION})
        assert status == 401 and body["error"]["code"] == "invalid_api_key" and "Missing API key" in body["error"]["message"]
        assert post(s.url + "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 2}, key="s3cret")[0] == 200
        with urllib.request.urlopen(s.url + "/metrics") as r:  # open, as in vLLM, for Prometheus scrapers
            text = r.read().decode()
            assert metric(text, "pagedeck:api_requests_total") == 1 and metric(text, "vllm:num_preemptions_total") == 0
        assert s.client().models.list().data[0].id == s.model_name


def test_a_request_without_max_tokens_may_fill_the_context():
    """Pages are taken as a reply grows, so a request that names no limit gets the whole room the context
    leaves (as OpenAI and vLLM); --default-max-tokens still caps it where an operator wants a cap."""
    from engine.server.app import DEFAULT_MAX_TOKENS
    from engine.server.requests import _max_tokens

    assert DEFAULT_MAX_TOKENS is None
    assert _max_tokens({}, "chat", 100, 4096, DEFAULT_MAX_TOKENS) == 3996
    assert _max_tokens({}, "chat", 100, 4096, 8) == 8
    assert _max_tokens({"max_tokens": 50}, "chat", 100, 4096, DEFAULT_MAX_TOKENS) == 50

"""Hypothesis-built requests through the server's parser, the model's chat template and its tokenizer, and
hypothesis-built sampler settings through the sampler: whatever arrives, the answer is a request or an
ApiError 4xx naming the problem, and a valid sampler always draws a token (never an exception that would
fail every job in the batch, never a 5xx).

Histories have odd roles, missing/empty/huge contents, unicode including lone surrogates (JSON's \\ud800
escapes decode to them), nested and foreign content parts, and extra fields.
"""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import DynamicGeneratorAsync, Model, PagedCache, Tokenizer
from engine.contract import SamplerSettings
from engine.sampling.sampler import JobSampler
from engine.server.errors import ApiError
from engine.server.requests import GenerationRequest, parse_request
from engine.server.served import ServedModel

ANY_CHAR = st.characters(codec=None, categories=None, exclude_characters="")  # Cs (surrogates) included
TEXT = st.one_of(st.text(ANY_CHAR, max_size=40), st.sampled_from(["", " ", "\x00", "<|im_end|>", "{{ 1/0 }}",
                                                                  "{% raise_exception('x') %}", "\ud800", "🦜" * 50]),
                 st.builds(lambda c, n: c * n, st.sampled_from(["x", "ü ", "的"]), st.integers(1000, 60000)))
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                       max_leaves=6)
PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_audio", "", "TEXT"]),
                           "text": JSONISH}, optional={"image_url": JSONISH}),
    JSONISH,
)
CONTENT = st.one_of(TEXT, st.lists(PART, max_size=4), st.lists(st.lists(PART, max_size=2), max_size=2), JSONISH)
ROLE = st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "", "User"]),
                 JSONISH)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLE, "content": CONTENT},
                          optional={"name": JSONISH, "tool_calls": JSONISH, "extra": JSONISH}),
    st.fixed_dictionaries({"role": ROLE}), JSONISH,
)
HISTORY = st.one_of(st.lists(MESSAGE, max_size=8), JSONISH)


@pytest.fixture(scope="module")
def served(tiny_llama_folder):
    model, tok = Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)
    gen = DynamicGeneratorAsync(model=model, cache=PagedCache(model, max_tokens=1024, page_size=16), tokenizer=tok)
    yield ServedModel(gen, tok, "tiny")
    asyncio.run(gen.close())


def check(served: ServedModel, kind: str, body) -> None:
    # As the server receives it: through JSON (a lone surrogate survives as a \ud800 escape).
    body = json.loads(json.dumps(body))
    try:
        req = parse_request(kind, body, served, 16)
    except ApiError as exc:
        assert 400 <= exc.status < 500 and exc.message, exc.body()
        return
    assert isinstance(req, GenerationRequest) and req.input_ids.shape[1] > 0
    assert req.input_ids.shape[1] + req.max_tokens <= served.max_seq_len


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(history=HISTORY, extra=st.dictionaries(st.sampled_from(["max_tokens", "stop", "n", "user", "logprobs",
                                                               "top_logprobs", "stream"]), JSONISH, max_size=2))
def test_any_chat_history_is_a_request_or_a_4xx(served, history, extra):
    check(served, "chat", {"messages": history, **extra})


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(prompt=st.one_of(TEXT, st.lists(st.integers(-5, 70000), max_size=6), st.lists(TEXT, max_size=2), JSONISH))
def test_any_completion_prompt_is_a_request_or_a_4xx(served, prompt):
    check(served, "completion", {"prompt": prompt, "max_tokens": 4})


def test_a_lone_surrogate_in_a_message_is_refused_with_a_400_naming_it(served):
    with pytest.raises(ApiError) as caught:
        parse_request("chat", {"messages": [{"role": "user", "content": "hi \ud800"}]}, served, 16)
    assert caught.value.status == 400 and "surrogate" in caught.value.message


FLOATS = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(temperature=st.one_of(st.just(0.0), st.floats(0, 2), st.sampled_from([5e-324, 1e-300, 1e-40])),
       top_p=st.one_of(st.floats(5e-324, 1.0), st.just(1.0)), min_p=st.floats(0, 1), top_k=st.integers(0, 300),
       rep=st.one_of(st.floats(1e-300, 1e300), st.sampled_from([5e-324, 1.0])),
       presence=st.floats(-2, 2), frequency=st.floats(-2, 2),
       bias=st.dictionaries(st.integers(0, 255), st.floats(-100, 100), max_size=4),
       logits=st.lists(st.floats(-1e4, 1e4, width=32), min_size=256, max_size=256),
       context=st.lists(st.integers(0, 255), max_size=12), seed=st.integers(0, 2**63 - 1))
def test_any_valid_sampler_draws_a_token(temperature, top_p, min_p, top_k, rep, presence, frequency, bias, logits,
                                         context, seed):
    s = SamplerSettings(temperature=temperature, top_p=top_p, min_p=min_p, top_k=top_k, token_repetition_penalty=rep,
                        token_presence_penalty=presence, token_frequency_penalty=frequency, token_bias=bias or None)
    s.validate()
    row = np.array(logits, dtype=np.float32)
    r = JobSampler(s, seed, vocab_size=256).sample(row.copy(), context, return_top_tokens=3)
    assert 0 <= r.token < 256 and 0.0 <= r.prob <= 1.0 and len(r.top_tokens) == 3
    if temperature < 1e-30 and rep == 1.0 and presence == frequency == 0 and not bias:  # as good as greedy
        assert row[r.token] == row.max()


def test_a_tiny_temperature_is_greedy_not_a_random_draw():
    row = np.linspace(-3, 3, 256, dtype=np.float32)
    for seed in range(20):
        r = JobSampler(SamplerSettings(temperature=1e-300), seed, vocab_size=256).sample(row.copy())
        assert r.token == 255

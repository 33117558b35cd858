"""`n` choices through the OpenAI server with the official client (tiny random model): n jobs on one
prompt, prefilled once; greedy choices equal the engine's solo run, seeded ones differ and reproduce."""
from __future__ import annotations

import pytest

from engine import Model, Tokenizer
from tests.engine.test_server import solo
from tests.server_support import ServerThread

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server(tiny_llama_folder):
    with ServerThread(tiny_llama_folder) as s:
        yield s


def chat(word: str) -> list[dict]:
    """A chat no earlier request has cached (the prefill counts below start from nothing)."""
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": f"Tell me about {word}."}]


def test_greedy_n3_equals_the_solo_run_prefills_once_and_counts_usage(server, tiny_llama_folder):
    messages = chat("otters")
    before = server.snapshot()
    r = server.client().chat.completions.create(model=server.model_name, messages=messages, n=3, temperature=0,
                                                max_tokens=12)
    after = server.snapshot()
    want, tokens = solo((Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)), messages, n=12)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == [want] * 3
    prompt = r.usage.prompt_tokens
    assert r.usage.completion_tokens == 3 * len(tokens)  # summed over the choices; the prompt counted once
    assert r.usage.total_tokens == prompt + 3 * len(tokens)
    # The prompt went through the model once: the other two choices found all but its last token cached.
    assert after["prefill_tokens_total"] - before["prefill_tokens_total"] == prompt
    assert after["prefix_hit_tokens_total"] - before["prefix_hit_tokens_total"] == 2 * (prompt - 1)


def test_seeded_choices_differ_and_reproduce_and_the_completions_api_takes_n(server):
    client = server.client()

    def ask():
        return client.chat.completions.create(model=server.model_name, messages=chat("rivers"), n=3,
                                              temperature=1.0, seed=11, max_tokens=10)

    first = ask()
    texts = [c.message.content for c in first.choices]
    assert len(set(texts)) == 3
    assert [c.message.content for c in ask().choices] == texts
    one = client.chat.completions.create(model=server.model_name, messages=chat("rivers"), temperature=1.0,
                                         seed=12, max_tokens=10)
    assert one.choices[0].message.content == texts[1]  # choice i is seeded seed + i
    c = client.completions.create(model=server.model_name, prompt="Once upon a time", n=2, temperature=0,
                                  max_tokens=8)
    assert [x.index for x in c.choices] == [0, 1] and c.choices[0].text == c.choices[1].text
    assert c.usage.completion_tokens == 2 * 8


def test_streamed_n3_chunks_carry_their_index(server):
    client = server.client()
    messages = chat("lighthouses")
    whole = client.chat.completions.create(model=server.model_name, messages=messages, n=3, temperature=0,
                                           max_tokens=12)
    texts, finish, usage = ["", "", ""], [None] * 3, None
    for chunk in client.chat.completions.create(model=server.model_name, messages=messages, n=3, temperature=0,
                                                max_tokens=12, stream=True, stream_options={"include_usage": True}):
        if not chunk.choices:
            usage = chunk.usage
            continue
        (choice,) = chunk.choices
        assert finish[choice.index] is None  # nothing after a choice's finish chunk
        texts[choice.index] += choice.delta.content or ""
        finish[choice.index] = choice.finish_reason
    assert texts == [c.message.content for c in whole.choices]
    assert finish == [c.finish_reason for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    stream = client.completions.create(model=server.model_name, prompt="Once upon a time", n=2, temperature=0,
                                       max_tokens=6, stream=True)
    seen = {c.choices[0].index for c in stream if c.choices}
    assert seen == {0, 1}

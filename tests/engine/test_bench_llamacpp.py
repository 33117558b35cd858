"""The llama.cpp side of `python -m engine bench --peer llama.cpp` (only where llama-cpp-python is installed:
`pip install 'pagedeck[peers]'`). Plumbing and correctness of the runner; no speed is asserted."""
import json

import pytest

pytest.importorskip("llama_cpp")

from engine.bench.llamacpp import LlamaCpp  # noqa: E402
from engine.cli import main  # noqa: E402
from engine.model.tokenizer import Tokenizer  # noqa: E402
from engine.model.weights import default_model_path  # noqa: E402


def chat_ids(tok: Tokenizer, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}])
    return tok.encode(text, encode_special_tokens=True).reshape(-1).tolist()


def greedy(runner: LlamaCpp, prompts: list[list[int]], n: int) -> list[list[int]]:
    """n greedy tokens for every prompt, all sequences in one llama_batch per step."""
    runner.clear()
    toks = runner.decode([(s, p, 0) for s, p in enumerate(prompts)])
    out = [[t] for t in toks]
    for i in range(n - 1):
        toks = runner.decode([(s, [toks[s]], len(p) + i) for s, p in enumerate(prompts)])
        for s, t in enumerate(toks):
            out[s].append(t)
    return out


def test_runner_answers_like_the_model_alone_and_in_a_batch():
    tok = Tokenizer.load()
    # a plain completion: llama.cpp's 4-bit prefill of the chat-template question answers "L'Étoile, ..."
    paris = tok.encode("The capital of France is", encode_special_tokens=True).reshape(-1).tolist()
    other = chat_ids(tok, "Name a large ocean.")
    runner = LlamaCpp(default_model_path(), n_ctx=512, n_seq=8, threads=1)
    try:
        (alone,) = greedy(runner, [paris], 8)
        batched = greedy(runner, [other, paris, other], 8)
        assert "Paris" in tok.decode(alone), tok.decode(alone)  # the same GGUF, really decoded
        assert "Paris" in tok.decode(batched[1]), tok.decode(batched[1])  # sequence ids keep chats apart
        runner.clear()
        first = runner.decode([(0, paris, 0)])[0]
        runner.forget_after(0, len(paris) - 4)  # the prompt cache: keep a prefix, recompute the tail
        assert runner.decode([(0, paris[-4:], len(paris) - 4)])[0] == first
    finally:
        runner.close()


def test_bench_json_with_llamacpp_peer(capsys):
    rc = main(["bench", "--weights", "q4", "--streams", "2", "--prompt-tokens", "16", "--new-tokens", "4",
               "--shared-prefix", "32", "--tail-tokens", "8", "--threads", "1", "--repeats", "2",
               "--peer", "llama.cpp", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    result = json.loads(out.strip().splitlines()[-1])
    engine, peer, ratio, runs = result["engine"], result["peer"], result["ratio"], result["runs"]
    keys = {"batch1_tok_s", "streams_tok_s", "streams_decode_tok_s", "prefill_tok_s", "ttft_uncached_ms",
            "ttft_cached_ms", "load_s"}
    assert keys <= set(engine) and keys <= set(peer)
    assert all(peer[k] > 0 for k in keys)
    assert len(runs["engine"]) == len(runs["peer"]) == 2  # alternating repeats, medians reported
    assert ratio["batch1"] == pytest.approx(engine["batch1_tok_s"] / peer["batch1_tok_s"])
    assert ratio["streams_decode"] == pytest.approx(engine["streams_decode_tok_s"] / peer["streams_decode_tok_s"])
    assert result["setup"]["peer"] == "llama.cpp" and result["setup"]["weights"] == "packed"
    assert "llama.cpp" in out and "pagedeck / llama.cpp" in out

"""load_model_and_tokenizer: the model and its tokenizer as Model.load and Tokenizer.load give them, the tokenizer
built on its own thread while the weights load, and either one's failure raised."""
from __future__ import annotations

import threading

import pytest
import torch

from engine import Model, Tokenizer, load_model_and_tokenizer


def test_the_pair_is_what_each_load_gives_and_the_tokenizer_loads_beside_the_weights(monkeypatch):
    threads = []
    real = Tokenizer.load.__func__

    def recording(cls, path=None):
        threads.append(threading.current_thread())
        return real(cls, path)

    monkeypatch.setattr(Tokenizer, "load", classmethod(recording))
    model, tok = load_model_and_tokenizer(None, weights="packed")
    assert threads and threads[0] is not threading.current_thread()
    alone = Tokenizer.load(None)
    text = "What is the capital of France? <|im_end|>"
    ids = alone.encode(text, encode_special_tokens=True)
    assert torch.equal(tok.encode(text, encode_special_tokens=True), ids)
    other = Model.load(None, weights="packed")
    assert model.weight_format == other.weight_format == "packed"
    assert torch.equal(model.embedding(ids), other.embedding(ids))


def test_a_tokenizer_that_cannot_be_built_fails_the_load(tmp_path):
    from tools.models.synthetic_gguf import write_random_gguf

    path = write_random_gguf(tmp_path / "odd.gguf", "llama3-8b", 1, "Q8_0", vocab=None, pre="no-such-pre")
    with pytest.raises(NotImplementedError, match="pre-tokenizer 'no-such-pre' is not supported"):
        load_model_and_tokenizer(path, weights="packed", check_memory=False)


def test_a_missing_model_fails_with_the_models_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model_and_tokenizer(tmp_path / "nowhere.gguf")


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    from tools.models.synthetic_gguf import write_random_gguf

    return write_random_gguf(tmp_path_factory.mktemp("progress") / "tiny.gguf", "tiny", 4, "Q8_0")


def test_progress_reports_header_then_rising_weights_and_the_tokenizer_each_with_its_seconds(tiny_file):
    from engine.contract import LoadProgress

    seen: list[LoadProgress] = []
    lock = threading.Lock()

    def record(p: LoadProgress) -> None:
        with lock:
            seen.append(p)

    load_model_and_tokenizer(tiny_file, progress=record, weights="packed", check_memory=False)
    stages = [p.stage for p in seen]
    assert stages[0] == "header" and seen[1].stage == "header" and seen[1].done
    header_done = 1
    assert all(s != "header" for s in stages[header_done + 1:])  # the header comes first, once
    weights = [p for p in seen if p.stage == "weights"]
    fractions = [p.fraction for p in weights if not p.done]
    # the reports between come every 50 ms while the bytes move (tests/engine/test_move_queue.py): a tiny model
    # may move them all before the first
    assert fractions[0] == 0.0 and fractions == sorted(fractions) and fractions[-1] == 1.0
    steps = [b - a for a, b in zip(fractions[1:], fractions[2:])]
    assert all(step >= 0.01 or b == 1.0 for step, b in zip(steps, fractions[2:]))  # no flood of tiny steps
    tokenizer = [p for p in seen if p.stage == "tokenizer"]
    assert [p.done for p in tokenizer] == [False, True]
    for name in ("header", "weights", "tokenizer"):
        done = [p for p in seen if p.stage == name and p.done]
        assert len(done) == 1 and done[0].fraction == 1.0 and done[0].error is None
        assert done[0].elapsed_s > 0.0
    assert weights[-1].done and weights[-1].elapsed_s >= max(p.elapsed_s for p in weights[:-1])


def test_a_failing_load_reports_the_stage_it_failed_in(tmp_path, tiny_file):
    seen = []
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ValueError):
        load_model_and_tokenizer(bad, progress=seen.append, weights="packed", check_memory=False)
    assert [(p.stage, p.error is not None) for p in seen] == [("header", False), ("header", True)]

    from tools.models.synthetic_gguf import write_random_gguf

    odd = write_random_gguf(tmp_path / "odd.gguf", "tiny", 1, "Q8_0", pre="no-such-pre")
    seen.clear()
    with pytest.raises(NotImplementedError):
        load_model_and_tokenizer(odd, progress=seen.append, weights="packed", check_memory=False)
    failed = [p for p in seen if p.error is not None]
    assert [p.stage for p in failed] == ["tokenizer"] and "no-such-pre" in failed[0].error
    assert [p.stage for p in seen if p.done] == ["header", "weights"] or \
        [p.stage for p in seen if p.done] == ["header"]  # the weights may or may not finish first

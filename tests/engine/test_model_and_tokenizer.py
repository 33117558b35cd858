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
    from tools.synthetic_gguf import write_random_gguf

    path = write_random_gguf(tmp_path / "odd.gguf", "llama3-8b", 1, "Q8_0", vocab=None, pre="no-such-pre")
    with pytest.raises(NotImplementedError, match="pre-tokenizer 'no-such-pre' is not supported"):
        load_model_and_tokenizer(path, weights="packed", check_memory=False)


def test_a_missing_model_fails_with_the_models_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model_and_tokenizer(tmp_path / "nowhere.gguf")

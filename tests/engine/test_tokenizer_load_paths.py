"""A real-size (262,144-piece, Gemma-3-like) SentencePiece vocabulary loaded the ways a model load takes it:
on load_model_and_tokenizer's tokenizer thread, with its merges from the cache, and after the cache entry was
corrupted, each equal token for token to a cold build on the calling thread with no cache; and the plain-text
twin (engine.model.tokenizer.plain_twin) encoding exactly as the serialized copy it replaces."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from tokenizers import Tokenizer as HFTokenizer

from engine import envs
from engine.model import model_and_tokenizer
from engine.model.tokenizer import Tokenizer
from engine.model.tokenizer.plain_twin import plain_twin
from tests.engine.test_tokenizer import SPM_TEXTS, TEXTS
from tests.engine.test_tokenizer_gguf_size import _vocabulary_file

SIZE = 262_144


def _texts(tok: Tokenizer) -> list[str]:
    """The usual texts, and texts holding the vocabulary's special tokens between words."""
    specials = [tok._tok.id_to_token(i) for i in sorted(tok.special_token_ids)][:8]
    assert specials
    return TEXTS + SPM_TEXTS + [" " * 40 + "x", "漢字テスト " * 3] + [
        f"before {s}after{s} {s}" for s in specials] + ["".join(specials) + " tail"]


def _ids(tok: Tokenizer, texts: list[str]) -> list:
    return [(tok.encode(t).tolist(), tok.encode(t, encode_special_tokens=True).tolist()) for t in texts]


def _with_cache(monkeypatch, value: str):
    monkeypatch.setenv("PAGEDECK_TOKENIZER_CACHE", value)
    envs.refresh("PAGEDECK_TOKENIZER_CACHE")


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    return _vocabulary_file(tmp_path_factory.mktemp("vocab") / "gemma3.gguf", "spm", "gemma3", size=SIZE)


@pytest.fixture(scope="module")
def cold(vocabulary):
    with pytest.MonkeyPatch.context() as m:
        _with_cache(m, "0")
        try:
            return Tokenizer.load(vocabulary)
        finally:
            m.undo()
            envs.refresh("PAGEDECK_TOKENIZER_CACHE")


def _on_load_thread(path) -> tuple[Tokenizer, list]:
    """The tokenizer as load_model_and_tokenizer builds it (its stage, on its thread), and the stage's reports."""
    reports = []
    with ThreadPoolExecutor(1, thread_name_prefix="pagedeck-tokenizer") as pool:
        tok = pool.submit(model_and_tokenizer._load_tokenizer, path, reports.append).result()
    return tok, reports


def test_the_load_threads_cached_tokenizer_equals_a_cold_build(vocabulary, cold, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _with_cache(monkeypatch, str(cache))
    try:
        texts = _texts(cold)
        expected = _ids(cold, texts)
        stored, _ = _on_load_thread(vocabulary)  # builds and stores the merges
        (entry,) = cache.glob("*.merges")
        good = entry.read_bytes()
        cached, _ = _on_load_thread(vocabulary)  # takes them from the cache
        assert _ids(stored, texts) == expected
        assert _ids(cached, texts) == expected
        assert cached._tok.to_str() == cold._tok.to_str()

        entry.write_bytes(good[: len(good) // 3] + b"\x00" * 64)  # a corrupt entry: rebuilt, no error reported
        rebuilt, reports = _on_load_thread(vocabulary)
        assert [r.error for r in reports] == [None, None] and reports[-1].done
        assert _ids(rebuilt, texts) == expected
        assert entry.read_bytes() == good
    finally:
        monkeypatch.undo()
        envs.refresh("PAGEDECK_TOKENIZER_CACHE")


def test_the_plain_twin_encodes_as_the_serialized_copy(cold):
    copy = HFTokenizer.from_str(cold._tok.to_str())
    copy.encode_special_tokens = True
    twin = plain_twin(cold._tok)
    assert twin.to_str() == copy.to_str()
    assert twin.get_added_tokens_decoder() == copy.get_added_tokens_decoder()
    for text in _texts(cold):
        assert twin.encode(text, add_special_tokens=False).ids == copy.encode(text, add_special_tokens=False).ids, text
    special = cold._tok.id_to_token(min(cold.special_token_ids))
    assert cold.encode(special).shape[1] > 1  # plain text: the special token's characters, not its id
    assert cold.encode(special, encode_special_tokens=True).tolist() == [[min(cold.special_token_ids)]]


def test_a_pipeline_with_truncation_gets_the_serialized_copy(cold):
    """Settings the twin does not carry (truncation) make it fall back to the copy, which keeps them."""
    tok = HFTokenizer.from_str(cold._tok.to_str())
    tok.enable_truncation(4)
    twin = plain_twin(tok)
    assert twin.truncation is not None and twin.truncation["max_length"] == 4
    assert len(twin.encode("one two three four five six seven", add_special_tokens=False).ids) == 4

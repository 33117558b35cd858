"""The merge cache of SentencePiece GGUF tokenizers (engine.model.tokenizer.merge_cache): a cached load equals
the uncached build token for token and in its whole serialized pipeline, a second load takes its merges from
the cache, a changed file (same size and modification time, another header) never meets the old entry, and a
corrupt, truncated or foreign entry is rebuilt, never trusted."""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine import envs
from engine.model.tokenizer import Tokenizer, merge_cache, spm_merges
from engine.model.tokenizer.gguf_vocab import SPIECE
from tests.engine.test_tokenizer import SPM_TEXTS, TEXTS
from tests.engine.test_tokenizer_gguf_size import _vocabulary_file
from tools.models import _synthetic_vocab as synthetic_vocab

TEXTS_ALL = TEXTS + SPM_TEXTS + [" " * 130 + "x", "漢字テスト " * 3]
SIZE = 32_768  # a SentencePiece vocabulary big enough for every split length, small enough to build quickly


def _spm_file(path, arch: str = "gemma3", reorder: bool = False):
    """A Gemma-3-like SentencePiece GGUF; `reorder`: the same pieces with a stretch of them in reverse order
    (the same bytes in all, other ranks, so other merges)."""
    vocabulary = synthetic_vocab.spm_vocabulary

    def reordered(size: int, seed: int = 0):
        tokens, scores, types = vocabulary(size, seed)
        tokens[20_000:30_000] = tokens[20_000:30_000][::-1]
        return tokens, scores, types

    with pytest.MonkeyPatch.context() as m:
        if reorder:
            m.setattr(synthetic_vocab, "spm_vocabulary", reordered)
        return _vocabulary_file(path, "spm", arch, size=SIZE)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("PAGEDECK_TOKENIZER_CACHE", str(folder))
    envs.refresh("PAGEDECK_TOKENIZER_CACHE")
    yield folder
    monkeypatch.undo()
    envs.refresh("PAGEDECK_TOKENIZER_CACHE")


def _uncached(path, monkeypatch) -> Tokenizer:
    with monkeypatch.context() as m:
        m.setenv("PAGEDECK_TOKENIZER_CACHE", "0")
        envs.refresh("PAGEDECK_TOKENIZER_CACHE")
        try:
            assert merge_cache.cache_dir() is None
            return Tokenizer.load(path)
        finally:
            envs.refresh("PAGEDECK_TOKENIZER_CACHE")


def _same(a: Tokenizer, b: Tokenizer) -> None:
    for text in TEXTS_ALL:
        assert a.encode(text).tolist() == b.encode(text).tolist(), text
        assert a.encode(text, encode_special_tokens=True).tolist() == \
            b.encode(text, encode_special_tokens=True).tolist(), text
    assert a._tok.to_str() == b._tok.to_str()  # every merge, in the same order


def _no_recovery(monkeypatch) -> None:
    """Make recovering merges from the vocabulary fail: a load that still works took them from the cache."""
    def fail(*args, **kwargs):
        raise AssertionError("merges recovered although the cache holds them")

    monkeypatch.setattr(spm_merges, "merge_indices", fail)
    monkeypatch.setattr("engine.model.tokenizer.gguf_vocab.merge_indices", fail)


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_a_cached_load_equals_the_uncached_build(tmp_path, cache, monkeypatch, arch):
    path = _spm_file(tmp_path / f"{arch}.gguf", arch)
    first = Tokenizer.load(path)
    entries = list(cache.glob("*.merges"))
    assert len(entries) == 1
    with monkeypatch.context() as m:
        _no_recovery(m)
        second = Tokenizer.load(path)
    reference = _uncached(path, monkeypatch)
    _same(first, reference)
    _same(second, reference)


def test_a_changed_file_never_meets_the_old_entry(tmp_path, cache, monkeypatch):
    """Another vocabulary of the same size written over the file, its modification time set back: only the
    header's digest tells the two apart, and the load builds the new file's tokenizer."""
    path = _spm_file(tmp_path / "model.gguf")
    stat = os.stat(path)
    before = Tokenizer.load(path)
    other = _spm_file(tmp_path / "other.gguf", reorder=True)
    assert os.path.getsize(other) == stat.st_size
    os.replace(other, path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == stat.st_mtime_ns
    changed = Tokenizer.load(path)
    _same(changed, _uncached(path, monkeypatch))
    assert changed._tok.to_str() != before._tok.to_str()
    assert len(list(cache.glob("*.merges"))) == 2


def _corrupt_flip(data: bytes) -> bytes:  # one bit of the arrays
    return data[:-5] + bytes([data[-5] ^ 1]) + data[-4:]


def _corrupt_truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _corrupt_header(data: bytes) -> bytes:  # the magic
    return b"X" + data[1:]


def _corrupt_out_of_range(data: bytes) -> bytes:
    """Arrays whose digest checks but whose last merge's right piece names no token."""
    head = merge_cache._HEAD.unpack_from(data)
    n_tokens, n_merges, n_renamed = head[2:5]
    ids = np.frombuffer(data, np.int32, 2 * n_merges + n_renamed, merge_cache._HEAD.size).copy()
    pairs, renamed = ids[:2 * n_merges], ids[2 * n_merges:]
    pairs[-1] = n_tokens
    return merge_cache._HEAD.pack(*head[:5], merge_cache._digest(pairs, renamed)) + ids.tobytes()


@pytest.mark.parametrize("corrupt", [_corrupt_flip, _corrupt_truncate, _corrupt_header, _corrupt_out_of_range])
def test_a_corrupt_entry_is_rebuilt_never_trusted(tmp_path, cache, monkeypatch, corrupt):
    path = _spm_file(tmp_path / "model.gguf")
    Tokenizer.load(path)
    (entry,) = cache.glob("*.merges")
    good = entry.read_bytes()
    entry.write_bytes(corrupt(good))
    rebuilt = Tokenizer.load(path)
    _same(rebuilt, _uncached(path, monkeypatch))
    assert entry.read_bytes() == good  # written again, whole


def test_an_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    with monkeypatch.context() as m:
        m.setenv("PAGEDECK_TOKENIZER_CACHE", str(blocker / "tokenizers"))
        envs.refresh("PAGEDECK_TOKENIZER_CACHE")
        try:
            path = _spm_file(tmp_path / "model.gguf")
            built = Tokenizer.load(path)
        finally:
            envs.refresh("PAGEDECK_TOKENIZER_CACHE")
    _same(built, _uncached(path, monkeypatch))


def _version_1_entry(path) -> bytes:
    """The entry the first layout held for the file: magic, version 1, piece count, merge count, a digest, then
    every merge's left piece and every right piece as indices into the vocabulary's distinct pieces."""
    import hashlib
    import struct

    from engine.model.gguf.file import GGUFFile

    meta = GGUFFile(path).metadata
    tokens = [SPIECE * len(t) if t.isspace() and " " in t and k != 4 else t  # Gemma's whitespace runs
              for t, k in zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"])]
    vocab = {t: i for i, t in enumerate(tokens)}
    left, right = spm_merges.merge_indices(vocab, {t: -i for i, t in enumerate(tokens)})
    left, right = left.astype(np.int32), right.astype(np.int32)
    digest = hashlib.blake2b(left.tobytes() + right.tobytes(), digest_size=32).digest()
    return struct.pack("<8sIqq32s", b"PDMERGES", 1, len(vocab), left.size, digest) + left.tobytes() + right.tobytes()


def test_an_entry_of_the_first_layout_is_rebuilt_never_misread(tmp_path, cache, monkeypatch):
    """A whole, self-consistent entry of the first layout under the file's key: its version is read first and
    rejected, the merges are recovered again and the entry is rewritten in the current layout."""
    path = _spm_file(tmp_path / "model.gguf")
    Tokenizer.load(path)
    (entry,) = cache.glob("*.merges")
    current = entry.read_bytes()
    old = _version_1_entry(path)
    entry.write_bytes(old)
    recovered = []
    real = spm_merges.merge_indices

    def counted(*args, **kwargs):
        recovered.append(1)
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr("engine.model.tokenizer.gguf_vocab.merge_indices", counted)
        rebuilt = Tokenizer.load(path)
    assert recovered == [1]
    _same(rebuilt, _uncached(path, monkeypatch))
    assert entry.read_bytes() == current != old

"""GGUF tokenizers of real size (tools.models._synthetic_vocab: a Qwen-2.5-sized byte-level BPE, a Gemma-3-sized
SentencePiece vocabulary as Gemma and as Llama files carry it) built in bulk by engine.model.tokenizer.gguf_vocab
equal the plain string-by-string construction, token for token on the tokenizer fidelity texts and in
their whole serialized pipeline, and the bulk build runs no Python code per token."""

from __future__ import annotations

import sys

import gguf
import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer as HFTokenizer, models

from engine.model.tokenizer import gguf_vocab, spm_merges
from engine.model.gguf.file import GGUFFile
from tests.engine.test_tokenizer import SPM_TEXTS, TEXTS
from tools.models import _synthetic_vocab as synthetic_vocab

# the fidelity texts, and runs of whitespace long enough to reach the 128-space tokens
FIDELITY = TEXTS + SPM_TEXTS + [" " * 130 + "x", "a" + "\n" * 20 + "\t" * 9 + "b", "漢字テスト " * 5]


def _reference(meta: dict) -> HFTokenizer:
    """The tokenizer built one string at a time: each token into the map, each merge split, each split of
    each SentencePiece token cut and looked up, sorted with Python keys."""
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    reference = HFTokenizer(models.BPE({}, []))
    if meta["tokenizer.ggml.model"] == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        reference = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    else:
        gemma = meta["general.architecture"].startswith("gemma")
        if gemma:
            tokens = [gguf_vocab.SPIECE * len(t) if " " in t and not t.strip() and k != 4 else t
                      for t, k in zip(tokens, types)]
        vocab = {t: i for i, t in enumerate(tokens)}
        scores = {t: -i for i, t in enumerate(tokens)} if gemma else dict(zip(tokens, meta["tokenizer.ggml.scores"]))
        merges = spm_merges._merges_by_strings(vocab, scores)  # each split cut and looked up as strings
        unk = tokens[meta["tokenizer.ggml.unknown_token_id"]]
        reference = HFTokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True,
                                           byte_fallback=True))
    built = gguf_vocab.from_gguf(meta, "reference")  # the same normalizer, pre-tokenizer and decoder
    reference.normalizer, reference.pre_tokenizer, reference.decoder = (
        built.normalizer, built.pre_tokenizer, built.decoder)
    reference.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, k in zip(tokens, types) if k == 3])
    reference.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == 4])
    return reference


def _vocabulary_file(path, kind: str, arch: str, **sizes):
    """A GGUF holding only a vocabulary (`sizes`: add_bpe_vocabulary's or add_spm_vocabulary's size)."""
    w = gguf.GGUFWriter(path, arch)
    (synthetic_vocab.add_bpe_vocabulary if kind == "bpe" else synthetic_vocab.add_spm_vocabulary)(w, **sizes)
    w.add_tensor("t", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module", params=[("bpe", "qwen2"), ("spm", "gemma3"), ("spm", "llama")],
                ids=["bpe-151936", "spm-gemma3-262144", "spm-llama-262144"])
def meta(request, tmp_path_factory):
    kind, arch = request.param
    path = _vocabulary_file(tmp_path_factory.mktemp("vocab") / f"{kind}-{arch}.gguf", kind, arch)
    return GGUFFile(path).metadata


def test_real_size_vocabularies_match_the_string_by_string_build(meta):
    size = len(meta["tokenizer.ggml.tokens"])
    assert size in (151_936, 262_144)
    built, reference = gguf_vocab.from_gguf(meta, "bulk"), _reference(meta)
    for text in FIDELITY:
        for special in (False, True):
            assert built.encode(text, add_special_tokens=special).ids == \
                reference.encode(text, add_special_tokens=special).ids, text
    assert built.to_str() == reference.to_str()  # every merge, in the same order


def test_the_bulk_build_runs_no_python_per_token(meta):
    """Python-level calls (each function, lambda or generator step) while building, counted with a
    profiler hook: a handful per split length, never one per token or merge."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        gguf_vocab.from_gguf(meta, "bulk")
    finally:
        sys.setprofile(None)
    assert calls < 5_000, f"{calls} Python calls building a {len(meta['tokenizer.ggml.tokens'])}-token tokenizer"


def test_merge_lists_are_the_pair_lists_they_stand_for():
    """MergeList (pieces one after another) and SplitMerges (GGUF's "left right" strings) read as the lists of
    pairs they replace, and tokenizers' BPE takes each as it is, building the model the list builds."""
    pairs = [("a", "b"), ("ab", "c"), ("\u2581", "x y")]
    merges = gguf_vocab.MergeList([piece for pair in pairs for piece in pair])
    split = gguf_vocab.SplitMerges(["a b", "ab c", "\u2581 x y"])
    for seq in (merges, split):
        assert len(seq) == 3 and list(seq) == pairs and seq[:] == pairs and seq[1:] == pairs[1:]
        assert seq[0] == pairs[0] and seq[-1] == pairs[-1]
        with pytest.raises(IndexError):
            seq[3]
    vocab = {t: i for i, t in enumerate(["a", "b", "c", "ab", "abc", "\u2581", "x y", "\u2581x y"])}
    for seq in (merges, split):
        model = models.BPE(vocab, seq)  # the sequence itself, not a list made from it
        assert HFTokenizer(model).to_str() == HFTokenizer(models.BPE(vocab, list(seq))).to_str()

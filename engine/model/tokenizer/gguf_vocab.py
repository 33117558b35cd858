"""A GGUF's vocabulary as a `tokenizers` pipeline: byte-level BPE ("gpt2") or SentencePiece ("llama").

A GGUF carries no tokenizer.json, only llama.cpp's metadata: tokens, token types, scores and (for BPE)
merges. Byte-level BPE splits text with the regex of the file's pre-tokenizer type; SentencePiece
files (Llama 2, Mistral v0.1, Gemma, Phi-3) list no merges, so they are recovered from the vocabulary,
best-scoring first (Gemma: file order, its scores do not follow its merge order). Each family gets the
normalizer/decoder its original tokenizer.json has, the way transformers' GGUF loader rebuilds them.

Vocabularies run to 262k tokens, so nothing here steps through them in Python bytecode: the vocabulary map,
the merge pairs and the SentencePiece merges are built with C-level iteration (dict(zip), map over
str/dict methods) and numpy, and only the few hundred special tokens are looked at one by one. The merges
reach the tokenizers library as a MergeList, a sequence that makes each (left, right) pair as the library
reads it, not as a list of 10^5 tuples held until the build ends (their allocation, the garbage collector's
passes over them and their release are a noticeable share of the build). A Qwen-2.5-sized BPE (151,936
tokens) then costs about what the tokenizers library's own BPE construction does. That construction is
most of the build, and it is not worth caching as the library's own serialized pipeline:
Tokenizer.from_str / from_file of the saved JSON take more CPU than building the BPE model from the
vocabulary map and merge pairs (they parse the JSON, then build the same model), and neither releases the
GIL. What is cached is the SentencePiece merge recovery (merge_cache), as token ids, so a cached load
selects the merges' pieces from the token list with one numpy selection (the string objects the
vocabulary map holds, none made anew).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from itertools import repeat

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from engine.model.tokenizer import merge_cache
from engine.model.tokenizer.spm_merges import merge_indices

SPIECE = "\u2581"  # SentencePiece's visible space
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4

# llama.cpp pre-tokenizer types (tokenizer.ggml.pre) -> how text is split before BPE.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_SPLIT = (  # Phi-4-mini
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's split where tokenizer.ggml.pre is "default" or missing: punctuation runs, GPT-2's words,
# digit runs, then those cut into threes (not GPT-2's own split, which "gpt2" names)
_DEFAULT_SPLITS = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]"]
PRE_SPLITS = {
    "default": _DEFAULT_SPLITS, "gpt2": [_GPT2_SPLIT], "gpt-2": [_GPT2_SPLIT],
    "smollm": [r"\p{N}", _GPT2_SPLIT],  # digits one by one, then GPT-2
    "llama3": [_LLAMA3_SPLIT], "llama-v3": [_LLAMA3_SPLIT], "llama-bpe": [_LLAMA3_SPLIT],
    "smaug-bpe": [_LLAMA3_SPLIT], "dbrx": [_LLAMA3_SPLIT], "falcon3": [_LLAMA3_SPLIT],
    "qwen2": [_QWEN2_SPLIT], "deepseek-r1-qwen": [_QWEN2_SPLIT], "megrez": [_QWEN2_SPLIT],
    "gpt-4o": [_GPT4O_SPLIT], "llama4": [_GPT4O_SPLIT],
}
_IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3"}
_BOS_BY_DEFAULT = {"llama3", "llama-v3", "llama-bpe", "falcon3"}  # llama.cpp's LLAMA3 pre-type sets add_bos
TOKENIZER_MODELS = ("gpt2", "llama")
_NONE = np.empty(0, np.int64)  # no token ids


def from_gguf(meta: dict, source: str, cache_key: str | None = None) -> HFTokenizer:
    """The tokenizer a GGUF's metadata describes; a clear error for kinds we do not build. `cache_key`
    (GGUFFile.version_key of the file the metadata comes from) lets a SentencePiece vocabulary's merges come
    from, and go to, the merge cache."""
    kind = meta.get("tokenizer.ggml.model")
    if kind not in TOKENIZER_MODELS:
        raise NotImplementedError(
            f"{source}: GGUF tokenizer model {kind!r} is not supported (supported: {', '.join(TOKENIZER_MODELS)}); "
            "load the model's Hugging Face folder with tokenizer.json instead")
    try:
        tokens: list[str] = meta["tokenizer.ggml.tokens"]
    except KeyError:
        raise ValueError(f"{source}: GGUF tokenizer metadata is missing tokenizer.ggml.tokens") from None
    types = np.asarray(meta.get("tokenizer.ggml.token_type") or np.ones(len(tokens)), dtype=np.int64)
    if kind == "gpt2":
        tok = _byte_level(meta, tokens, source)
    else:
        tok = _sentencepiece(meta, tokens, types, meta.get("general.architecture", ""), cache_key)
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in np.flatnonzero(types == _GGUF_CONTROL).tolist()])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i in np.flatnonzero(types == _GGUF_USER_DEFINED).tolist()])
    return tok


def recovers_merges(meta: dict) -> bool:
    """Whether building this file's tokenizer recovers merges from the vocabulary (a SentencePiece file
    lists none), the step the merge cache keeps."""
    return meta.get("tokenizer.ggml.model") == "llama" and "tokenizer.ggml.merges" not in meta


def default_add_bos(meta: dict) -> bool:
    """Whether text starts with BOS, as llama.cpp decides: the file's tokenizer.ggml.add_bos_token, else
    yes for SentencePiece vocabularies and for the Llama-3 family of BPE pre-tokenizers, no for the rest."""
    flag = meta.get("tokenizer.ggml.add_bos_token")
    if flag is not None:
        return bool(flag)
    kind = meta.get("tokenizer.ggml.model")
    return kind == "llama" or (kind == "gpt2" and meta.get("tokenizer.ggml.pre") in _BOS_BY_DEFAULT)


def _byte_level(meta: dict, tokens: list[str], source: str) -> HFTokenizer:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_SPLITS:
        raise NotImplementedError(
            f"{source}: GGUF pre-tokenizer {pre!r} is not supported; supported: {', '.join(sorted(PRE_SPLITS))}")
    if "tokenizer.ggml.merges" not in meta:
        raise ValueError(f"{source}: GGUF tokenizer metadata is missing tokenizer.ggml.merges")
    tok = HFTokenizer(_bpe(token_ids(tokens), SplitMerges(meta["tokenizer.ggml.merges"]),
                           ignore_merges=pre in _IGNORE_MERGES))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_SPLITS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def token_ids(tokens: list[str]) -> dict[str, int]:
    """{token: id}, a repeated token keeping its last id (as a dict comprehension over the list would)."""
    return dict(zip(tokens, range(len(tokens))))


class MergeList(Sequence):
    """Merges as the (left, right) pairs tokenizers' BPE takes, from a flat list of their pieces (left, right,
    left, right, ...), each pair made when it is read: tokenizers iterates the sequence once and drops each
    pair before taking the next, so no pair outlives its turn where a list would hold one per merge."""

    def __init__(self, pieces: list[str]):
        self._pieces = pieces

    def __len__(self) -> int:
        return len(self._pieces) // 2

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError("merge index out of range")
        i %= len(self)
        return self._pieces[2 * i], self._pieces[2 * i + 1]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        pieces = iter(self._pieces)
        return zip(pieces, pieces)


class SplitMerges(Sequence):
    """A GGUF's merges ("left right", split at the first space) as (left, right) pairs, each split when read
    (as MergeList's pairs are made)."""

    def __init__(self, merges: list[str]):
        self._merges = merges

    def __len__(self) -> int:
        return len(self._merges)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [_LEFT_RIGHT(m.partition(" ")) for m in self._merges[i]]
        return _LEFT_RIGHT(self._merges[i].partition(" "))

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return map(_LEFT_RIGHT, map(str.partition, self._merges, repeat(" ")))


_LEFT_RIGHT = operator.itemgetter(0, 2)


def _bpe(vocab: dict[str, int], merges: Sequence[tuple[str, str]], **options) -> models.BPE:
    """tokenizers' BPE model of `vocab` and `merges`; where the library takes no sequence but a list (it
    reads any sequence today), the merges as a list."""
    try:
        return models.BPE(vocab, merges, **options)
    except TypeError:
        return models.BPE(vocab, list(merges), **options)


def _sentencepiece(meta: dict, tokens: list[str], types: np.ndarray, arch: str, cache_key: str | None) -> HFTokenizer:
    gemma = arch.startswith("gemma")
    listed = "tokenizer.ggml.merges" in meta
    entry = merge_cache.load(cache_key, len(tokens)) if cache_key is not None and not listed else None
    renamed = entry.renamed if entry is not None else _whitespace_runs(tokens, types) if gemma else _NONE
    if renamed.size:  # Gemma stores whitespace-run tokens with real spaces; its text has them as the visible space
        tokens = list(tokens)
        for i in renamed.tolist():
            tokens[i] = SPIECE * len(tokens[i])
    vocab = token_ids(tokens)
    if listed:
        merges = SplitMerges(meta["tokenizer.ggml.merges"])
    else:
        if entry is None:
            entry = merge_cache.Entry(_recovered_pairs(meta, tokens, vocab, gemma), renamed)
            if cache_key is not None:
                merge_cache.store(cache_key, len(tokens), entry)
        merges = MergeList(np.fromiter(tokens, object, len(tokens)).take(entry.pairs.reshape(-1)).tolist())
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    tok = HFTokenizer(_bpe(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [decoders.Replace(SPIECE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if not meta.get("tokenizer.ggml.add_space_prefix", not gemma):  # Gemma's converter writes False
        tok.normalizer = normalizers.Replace(" ", SPIECE)
    else:  # SentencePiece's dummy prefix, as llama.cpp adds it: before every text, leading spaces or not, and
        # after every special token (a normalizer runs on each piece of text between them)
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPIECE), normalizers.Replace(" ", SPIECE)])
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    return tok


def _whitespace_runs(tokens: list[str], types: np.ndarray) -> np.ndarray:
    """The ids of Gemma's whitespace tokens holding real spaces, which its text writes as SentencePiece's
    visible space. User-defined ones keep their real spaces: they are matched in the raw text (from_gguf
    adds them)."""
    blank = np.fromiter(map(str.isspace, tokens), bool, len(tokens)) & (types != _GGUF_USER_DEFINED)
    return np.array([i for i in np.flatnonzero(blank).tolist() if " " in tokens[i]], np.int64)


def _recovered_pairs(meta: dict, tokens: list[str], vocab: dict[str, int], gemma: bool) -> np.ndarray:
    """The merges a SentencePiece vocabulary implies (spm_merges), best first, as (merges, 2) token ids."""
    keys = np.fromiter(vocab, object, len(vocab))
    scores = (dict(zip(tokens, range(0, -len(tokens), -1))) if gemma
              else dict(zip(tokens, meta.get("tokenizer.ggml.scores") or repeat(0.0, len(tokens)))))
    left, right = merge_indices(vocab, scores, keys)
    ids = np.fromiter(vocab.values(), np.int64, len(vocab))  # the id of each of keys' pieces
    return np.stack([ids[left], ids[right]], axis=1)

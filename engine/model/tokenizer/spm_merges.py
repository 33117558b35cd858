"""The BPE merges a scored SentencePiece vocabulary implies, found with numpy over every token at once.

A SentencePiece GGUF (Llama 2, Gemma, Phi-3) lists no merges; SentencePiece's own conversion to
tokenizer.json (and transformers') derives them: every split of a token into two pieces that are both in
the vocabulary is a merge, ranked by the token's score, then the longer left piece, then the longer right
piece, then the token's place in the vocabulary. A 262k-token vocabulary has ~2M splits; cutting each into
two Python strings and looking both up costs seconds. Here every split is hashed instead, from prefix sums
of the tokens' code points (a polynomial hash mod 2^64, so any substring's hash is two lookups and a
multiply), the hashes are matched against the vocabulary's in a numpy hash table, and each match is then
confirmed on the strings themselves (str.startswith / endswith and the length), so a hash collision can
never make a merge: the result is exactly the string-by-string one.
"""

from __future__ import annotations

import numpy as np

_P = np.uint64(0x9E3779B97F4A7C15)  # odd: invertible mod 2^64
_P_INV = np.uint64(pow(int(_P), -1, 1 << 64))
_MIX = np.uint64(0xD6E8FEB86659FD93)  # odd: spreads a short string's small hash over the high bits
_CHUNK = 1 << 16  # code points of tokens hashed at once (bounds the temporaries to a few MB)


def merge_indices(vocab: dict[str, int], scores: dict[str, float],
                  keys: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The merges of the vocabulary `vocab` ({piece: id}) whose tokens are ranked by `scores` ({token:
    score}), best first, as the module docstring describes: (left, right) int64 indices into the vocabulary's
    pieces (`keys`: np.fromiter(vocab, object), passed where the caller has it), the form merge_cache keeps."""
    if keys is None:
        keys = np.fromiter(vocab, object, len(vocab))
    key_len = np.fromiter(map(len, keys), np.int64, len(keys))
    key_hash = _hashes(keys.tolist(), key_len)
    ranked = np.sort(key_hash)
    if np.any(ranked[1:] == ranked[:-1]):  # two pieces share a hash: fall back to strings
        place = dict(zip(vocab, range(len(vocab))))
        merges = _merges_by_strings(vocab, scores)
        return (np.fromiter((place[a] for a, _ in merges), np.int64, len(merges)),
                np.fromiter((place[b] for _, b in merges), np.int64, len(merges)))
    table = _Table(key_hash)
    tokens = np.fromiter(scores, object, len(scores))
    score = np.fromiter(scores.values(), np.float64, len(tokens))
    length = np.fromiter(map(len, tokens), np.int64, len(tokens))
    found = [_splits(tokens, length, lo, hi, keys, key_len, table) for lo, hi in _chunks(length)]
    u, cut, left, right = (np.concatenate([f[k] for f in found]) if found else np.empty(0, np.int64)
                           for k in range(4))
    order = np.lexsort((u, cut - length[u], -cut, -score[u]))  # the last key ranks first
    return left[order], right[order]


def _chunks(length: np.ndarray):
    """[lo, hi) ranges of tokens holding about _CHUNK code points each."""
    ends = np.cumsum(length)
    lo = 0
    while lo < length.size:
        hi = max(lo + 1, int(np.searchsorted(ends, ends[lo] - length[lo] + _CHUNK, side="right")))
        yield lo, hi
        lo = hi


def _code_points(strings: list[str]) -> np.ndarray:
    """The strings' code points, one after another, each plus one (so a NUL still changes a hash)."""
    raw = "".join(strings).encode("utf-32-le", "surrogatepass")
    return np.frombuffer(raw, np.uint32).astype(np.uint64) + np.uint64(1)


def _prefix_sums(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(G, inverse powers): G[k] = sum of code[m] * P^m for m < k; the hash of code[a:b] is then
    (G[b] - G[a]) * P^-a, the same wherever the substring lies."""
    n = code.size
    powers = np.empty(n + 1, np.uint64)
    powers[0] = 1
    np.cumprod(np.full(n, _P, np.uint64), out=powers[1:])
    g = np.zeros(n + 1, np.uint64)
    np.cumsum(code * powers[:n], out=g[1:])
    powers[0] = 1
    np.cumprod(np.full(n, _P_INV, np.uint64), out=powers[1:])
    return g, powers


def _hashes(strings: list[str], length: np.ndarray) -> np.ndarray:
    """Each whole string's hash."""
    out = np.empty(len(strings), np.uint64)
    for lo, hi in _chunks(length):
        g, inv = _prefix_sums(_code_points(strings[lo:hi]))
        end = np.cumsum(length[lo:hi])
        start = end - length[lo:hi]
        out[lo:hi] = (g[end] - g[start]) * inv[start]
    return out


def _splits(tokens: np.ndarray, length: np.ndarray, lo: int, hi: int, keys: np.ndarray, key_len: np.ndarray,
            table: _Table) -> tuple[np.ndarray, ...]:
    """(token, left length, left piece, right piece) of every split of tokens[lo:hi] into two pieces of
    the vocabulary (pieces as indices into its keys)."""
    n = length[lo:hi]
    g, inv = _prefix_sums(_code_points(tokens[lo:hi].tolist()))
    per = np.maximum(n - 1, 0)  # splits of each token
    u = np.repeat(np.arange(lo, hi), per)
    cut = np.arange(u.size, dtype=np.int64) - np.repeat(np.cumsum(per) - per, per) + 1
    a = np.repeat(np.cumsum(n) - n, per)  # where the token starts
    b, c = a + cut, a + length[u]
    left = table.find((g[b] - g[a]) * inv[a])
    right = table.find((g[c] - g[b]) * inv[b])
    hit = np.flatnonzero((left >= 0) & (right >= 0))
    u, cut, left, right = u[hit], cut[hit], left[hit], right[hit]
    # confirmed on the strings (hashes can collide, strings cannot): the pieces' lengths, then their text
    whole = tokens[u].tolist()
    same = ((key_len[left] == cut) & (key_len[right] == length[u] - cut)
            & np.fromiter(map(str.startswith, whole, keys[left].tolist()), bool, len(whole))
            & np.fromiter(map(str.endswith, whole, keys[right].tolist()), bool, len(whole)))
    return u[same], cut[same], left[same], right[same]


class _Table:
    """Distinct 64-bit hashes -> their index, in an open-addressing table probed a round at a time for all
    queries at once (a sorted search over 262k hashes costs ~10x more for millions of queries)."""

    def __init__(self, hashes: np.ndarray):
        bits = max(4, (4 * hashes.size).bit_length())
        self.shift = np.uint64(64 - bits)  # slot: the high bits of hash * _MIX (Fibonacci hashing)
        self.hash = np.zeros(1 << bits, np.uint64)
        self.index = np.full(1 << bits, -1, np.int64)
        pending = np.arange(hashes.size)
        slot = self._slot(hashes)
        while pending.size:
            free = self.index[slot] < 0
            taken, first = np.unique(slot[free], return_index=True)  # one key per free slot a round
            winners = pending[free][first]
            self.index[taken], self.hash[taken] = winners, hashes[winners]
            left = np.ones(pending.size, bool)
            left[np.flatnonzero(free)[first]] = False
            pending, slot = pending[left], (slot[left] + 1) & (self.index.size - 1)

    def _slot(self, hashes: np.ndarray) -> np.ndarray:
        return ((hashes * _MIX) >> self.shift).astype(np.int64)

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """The index of each hash, -1 where the table lacks it."""
        out = np.full(hashes.size, -1, np.int64)
        pending = np.arange(hashes.size)
        slot = self._slot(hashes)
        while pending.size:
            at = self.index[slot]
            hit = (at >= 0) & (self.hash[slot] == hashes[pending])
            out[pending[hit]] = at[hit]
            go = (at >= 0) & ~hit  # an occupied slot holding another hash: probe the next one
            pending, slot = pending[go], (slot[go] + 1) & (self.index.size - 1)
        return out


def _merges_by_strings(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The same merges, each split cut and looked up as strings (for vocabularies whose hashes collide)."""
    found = []
    for token, score in scores.items():
        local = [(token[:i], token[i:], score) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found += local
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in found]


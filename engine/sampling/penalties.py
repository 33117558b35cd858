"""Context-dependent logit penalties: repetition / frequency / presence and DRY.

They run on the CPU in numpy because per-call overhead dominates at one row of 49k logits: numpy's
small-op cost is a few microseconds where torch's is tens, and the sampler runs once per job per step.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable, Sequence

import numpy as np


def context_array(context: Any, window: int) -> np.ndarray:
    """The last `window` ids of the context (all if window < 0) as int64, converting only that slice."""
    if isinstance(context, np.ndarray):
        arr = context.reshape(-1)
    elif hasattr(context, "detach"):  # torch tensor
        arr = context.detach().reshape(-1).cpu().numpy()
    else:
        seq = context if window < 0 or len(context) <= window else context[len(context) - window:]
        return np.array(seq, dtype=np.int64).reshape(-1)
    arr = arr.astype(np.int64, copy=False)
    return arr if window < 0 or arr.shape[0] <= window else arr[arr.shape[0] - window:]


class ContextCache:
    """int64 mirror of a job's growing token list: each call converts only the tokens appended since the
    last one (a 2k-token list costs ~120 us to convert whole, the check below ~10 us). A list that was
    rewound or rewritten no longer starts with the mirror, and is converted afresh."""

    def __init__(self) -> None:
        self._list: list[int] = []
        self._arr = np.empty(256, dtype=np.int64)

    def array(self, context: Any, window: int) -> np.ndarray:
        if not isinstance(context, list):
            return context_array(context, window)
        n = len(self._list)
        if len(context) < n or context[:n] != self._list:
            self._list, n = [], 0
        if len(context) > n:
            new = context[n:]
            end = n + len(new)
            if end > self._arr.shape[0]:
                grown = np.empty(max(end, 2 * self._arr.shape[0]), dtype=np.int64)
                grown[:n] = self._arr[:n]
                self._arr = grown
            self._arr[n:end] = new
            self._list.extend(new)
        arr = self._arr[: len(self._list)]
        return arr if window < 0 or arr.shape[0] <= window else arr[arr.shape[0] - window:]


def apply_repetition_penalties(
    logits: np.ndarray,
    ctx: np.ndarray,
    repetition: float,
    sustain: int,
    decay: int,
    frequency: float,
    presence: float,
) -> None:
    """ExLlamaV2's penalty rule, vectorised, in place.

    The last `sustain` tokens (all when -1) carry the full penalties, the `decay` tokens before them a
    linearly fading share. Multiplicative repetition and additive presence count once per distinct token
    (weighted by its most recent occurrence); frequency counts every occurrence.
    """
    vocab = logits.shape[0]
    n = ctx.shape[0]
    sust = n if sustain < 0 else sustain
    span = min(n, sust + decay)
    if span <= 0:
        return
    toks = ctx[n - span:]
    dist = np.arange(span - 1, -1, -1, dtype=np.float64)  # 0 = most recent token
    keep = (toks >= 0) & (toks < vocab)  # ids past the vocabulary (embeddings) are not penalised
    if not keep.all():
        toks, dist = toks[keep], dist[keep]
        if toks.shape[0] == 0:
            return
    weight = np.clip(1.0 - np.maximum(dist - sust, 0.0) / decay, 0.0, 1.0) if decay > 0 else None

    # A table over the vocabulary (not np.unique, which sorts) finds the distinct tokens; each one's
    # weight is that of its most recent occurrence, the largest, since weights grow toward the end.
    if decay > 0:
        w_table = np.zeros(vocab, dtype=np.float64)
        np.maximum.at(w_table, toks, weight)
        uniq = np.flatnonzero(w_table)
        w_last = w_table[uniq]
    else:
        seen = np.zeros(vocab, dtype=bool)
        seen[toks] = True
        uniq = np.flatnonzero(seen)
        w_last = 1.0
    vals = logits[uniq].astype(np.float64)
    if repetition != 1.0:
        rep = 1.0 + w_last * (repetition - 1.0)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # both branches run; extremes saturate
            vals = np.where(vals > 0.0, vals / rep, vals * rep)
    if presence != 0.0:
        vals -= presence * w_last
    if frequency != 0.0:
        if decay > 0:
            w_sum = np.bincount(toks, weights=weight, minlength=vocab)[uniq]
        else:
            w_sum = np.bincount(toks, minlength=vocab)[uniq]
        vals -= frequency * w_sum
    with np.errstate(over="ignore"):
        logits[uniq] = vals.astype(np.float32)


def apply_dry(
    logits: np.ndarray,
    ctx: np.ndarray,
    breaker: np.ndarray,
    multiplier: float,
    base: float,
    allowed_length: int,
    max_ngram: int,
) -> dict[int, float]:
    """DRY ("don't repeat yourself"), in place; returns {token: penalty} for inspection.

    For every earlier place where the context's current suffix already occurred, the token that followed
    it there would extend a verbatim repeat. Its logit drops by multiplier * base ** (L - allowed_length)
    where L is the longest such match (capped at max_ngram), if L >= allowed_length. Matches never span a
    sequence-breaker token (`breaker` is a bool table over the vocabulary), so repeated structure such as
    newlines or "Name:" is not punished.
    """
    vocab = logits.shape[0]
    n = ctx.shape[0]
    if n < 2:
        return {}
    in_vocab = (ctx >= 0) & (ctx < vocab)
    is_brk = np.ones(n, dtype=bool)  # ids outside the vocabulary (embeddings) also break a match
    is_brk[in_vocab] = breaker[ctx[in_vocab]]
    if is_brk[-1]:
        return {}
    ends = np.flatnonzero((ctx[:-1] == ctx[-1]) & ~is_brk[:-1])  # j: ctx[j] matches the last token
    if ends.shape[0] == 0:
        return {}
    length = np.ones(ends.shape[0], dtype=np.int64)
    alive = np.ones(ends.shape[0], dtype=bool)
    for k in range(1, min(max_ngram, n - 1)):
        tail = n - 1 - k
        if is_brk[tail]:
            break
        idx = ends - k
        ok = idx >= 0
        idx = np.where(ok, idx, 0)
        alive &= ok & (ctx[idx] == ctx[tail]) & ~is_brk[idx]
        if not alive.any():
            break
        length += alive
    hits = length >= allowed_length
    if not hits.any():
        return {}
    nxt = ctx[ends[hits] + 1]
    lens = length[hits]
    penalties: dict[int, float] = {}
    for tok, ln in zip(nxt.tolist(), lens.tolist()):
        if 0 <= tok < vocab:
            pen = multiplier * base ** (ln - allowed_length)
            if pen > penalties.get(tok, 0.0):
                penalties[tok] = pen
    if penalties:
        ids = np.fromiter(penalties.keys(), dtype=np.int64, count=len(penalties))
        logits[ids] -= np.fromiter(penalties.values(), dtype=np.float32, count=len(penalties))
    return penalties


def _pieces(tokenizer: Any) -> Sequence[str] | None:
    """Decoded text of every token id, if the tokenizer exposes it (ours: .pieces; ExLlamaV2's name too)."""
    pieces = getattr(tokenizer, "pieces", None)
    if callable(pieces):
        pieces = pieces()
    if pieces is None and hasattr(tokenizer, "get_id_to_piece_list"):
        pieces = tokenizer.get_id_to_piece_list()
    return pieces


# tokenizer -> {strings: ids}. Keyed weakly: a cache that held tokenizers (an lru_cache did) kept every
# model's tokenizer alive after the model was unloaded, one per reload up to its size.
_ids_cache: "weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], frozenset[int]]]" = weakref.WeakKeyDictionary()
_ids_lock = threading.Lock()
IDS_PER_TOKENIZER = 16  # distinct string sets remembered per tokenizer


def _ids_containing(tokenizer: Any, strings: tuple[str, ...]) -> frozenset[int]:
    """Cached per tokenizer, as long as the tokenizer lives (a tokenizer that can't be weakly referenced
    is not cached)."""
    try:
        with _ids_lock:
            known = _ids_cache.setdefault(tokenizer, {})
            hit = known.get(strings)
    except TypeError:
        return _compute_ids_containing(tokenizer, strings)
    if hit is None:
        hit = _compute_ids_containing(tokenizer, strings)
        with _ids_lock:
            known[strings] = hit
            while len(known) > IDS_PER_TOKENIZER:
                known.pop(next(iter(known)))
    return hit


def _compute_ids_containing(tokenizer: Any, strings: tuple[str, ...]) -> frozenset[int]:
    pieces = _pieces(tokenizer)
    if pieces is not None:
        return frozenset(i for i, p in enumerate(pieces) if p and any(s in p for s in strings))
    if not hasattr(tokenizer, "encode"):
        raise ValueError("tokenizer has neither .pieces nor .encode(); cannot map strings to token ids")
    ids: set[int] = set()
    for s in strings:
        enc = tokenizer.encode(s)
        flat = enc.reshape(-1).tolist() if hasattr(enc, "reshape") else list(enc)
        if flat:
            ids.add(int(flat[-1]))
    return frozenset(ids)


def token_ids_for(items: Iterable[str | int], tokenizer: Any, what: str) -> frozenset[int]:
    """Token ids for a mix of ids and strings; a string covers every token whose text contains it.

    Without per-token text (.pieces) a string maps to the last token of its encoding, as original DRY does.
    """
    ids: set[int] = set()
    strings: list[str] = []
    for item in items:
        if isinstance(item, str):
            strings.append(item)
        else:
            ids.add(int(item))
    if strings:
        if tokenizer is None:
            raise ValueError(f"{what} contains strings {strings!r} but no tokenizer was given to map them")
        ids |= _ids_containing(tokenizer, tuple(strings))
    return frozenset(ids)


def bool_table(ids: Iterable[int], vocab_size: int) -> np.ndarray:
    """(vocab_size,) bool array, True at the given ids (ids outside the vocabulary are dropped)."""
    table = np.zeros(vocab_size, dtype=bool)
    arr = np.fromiter((i for i in ids if 0 <= i < vocab_size), dtype=np.int64)
    table[arr] = True
    return table

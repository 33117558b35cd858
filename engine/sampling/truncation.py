"""Candidate-set stages of the sampler: the distribution is a pair (ids, probs) that each stage shrinks
and renormalises, in ExLlamaV2's order (top-k, top-p, min-p, typical, mirostat, late temperature, XTC),
followed by the draw (with skew).

Working on the surviving candidates rather than the full vocabulary is what keeps sampling cheap: with
top-k the full 49k row is touched once (argpartition) and everything after runs on k values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


_arange_cache: dict[int, np.ndarray] = {}


def _all_ids(n: int) -> np.ndarray:
    ids = _arange_cache.get(n)
    if ids is None:
        ids = _arange_cache[n] = np.arange(n, dtype=np.int64)
        ids.setflags(write=False)
    return ids


@dataclass
class Candidates:
    """Surviving tokens. Invariant: if not `sorted` (descending by prob), ids are ascending. Probs are
    float64 once the set is small; the full-vocabulary set keeps float32 to halve its memory traffic."""

    ids: np.ndarray  # int64 token ids
    probs: np.ndarray  # sums to 1 (up to rounding)
    sorted: bool

    def renormalize(self) -> None:
        self.probs = self.probs / self.probs.sum(dtype=np.float64)

    def keep(self, mask_or_idx) -> None:
        self.ids = self.ids[mask_or_idx]
        self.probs = self.probs[mask_or_idx]
        self.renormalize()

    def sort(self) -> None:
        if not self.sorted:
            order = np.argsort(-self.probs)  # deterministic; exact ties are not ordered by id
            self.ids, self.probs, self.sorted = self.ids[order], self.probs[order], True

    def top(self, k: int) -> tuple[list[int], list[float]]:
        """The k most probable candidates, descending, without sorting the whole set."""
        n = self.ids.shape[0]
        if self.sorted or k >= n:
            self.sort()
            return self.ids[:k].tolist(), self.probs[:k].tolist()
        idx = np.argpartition(self.probs, n - k)[n - k:]
        idx = idx[np.argsort(-self.probs[idx], kind="stable")]
        return self.ids[idx].tolist(), self.probs[idx].tolist()


def _softmax64(vals: np.ndarray, temperature: float) -> np.ndarray:
    """Shifted before dividing, so a tiny temperature sends the others to -inf (not inf - inf = NaN)."""
    v = vals.astype(np.float64)
    with np.errstate(over="ignore"):
        e = np.exp((v - v.max()) / temperature)
    return e / e.sum()


def _top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits (any order). A full argpartition of the row is the slow part of
    sampling, so first try the few logits within a margin of the max: if at least k lie there, the top
    k are among them (exact, not a heuristic); peaked LM rows almost always pass at the first margin."""
    m = logits.max()
    for margin in (8.0, 24.0):
        near = logits >= m - margin
        if np.count_nonzero(near) >= k:
            sub = np.flatnonzero(near)
            if sub.shape[0] == k:
                return sub
            return sub[np.argpartition(logits[sub], sub.shape[0] - k)[sub.shape[0] - k:]]
    n = logits.shape[0]
    return np.argpartition(logits, n - k)[n - k:]


_F32_MAX = float(np.finfo(np.float32).max)


def initial(logits: np.ndarray, temperature: float, top_k: int) -> Candidates:
    """softmax(logits / T) restricted to the top_k largest logits (the whole row when top_k = 0).

    Renormalising after top-k is the same as a softmax over the k logits, so the full row is never
    exponentiated when top-k is on. Masked (-inf) tokens get probability 0 (and are dropped with top-k).
    """
    n = logits.shape[0]
    if 0 < top_k < n:
        idx = _top_k_ids(logits, top_k)
        vals = logits[idx]
        finite = vals > -np.inf
        if not finite.all():
            idx, vals = idx[finite], vals[finite]
        order = np.lexsort((idx, -vals))
        idx, vals = idx[order].astype(np.int64), vals[order]
        return Candidates(idx, _softmax64(vals, temperature), True)
    e = logits - logits.max()
    if temperature != 1.0:  # 1/T capped at float32's max: a tiny T is greedy, not 0 * inf = NaN at the max
        with np.errstate(over="ignore"):
            e *= np.float32(min(1.0 / temperature, _F32_MAX))
    np.exp(e, out=e)
    e /= e.sum(dtype=np.float64)
    return Candidates(_all_ids(n), e, False)


def top_p(c: Candidates, p: float) -> None:
    """Nucleus: the smallest most-probable prefix whose mass reaches p.

    Before sorting, tokens below (1 - p) / n are dropped: together they weigh less than 1 - p, so the
    tokens above that bound already reach p and the nucleus lies among them. A peaked distribution
    then sorts a few hundred tokens instead of the vocabulary.
    """
    if not c.sorted:
        bound = (1.0 - p) / c.ids.shape[0]
        sel = np.flatnonzero(c.probs >= bound)
        if sel.shape[0] < c.ids.shape[0]:
            c.ids, c.probs = c.ids[sel], c.probs[sel]
        c.sort()  # probs are still fractions of the whole set, so the prefix test below is absolute
    cum = np.cumsum(c.probs, dtype=np.float64)
    n_keep = min(int(np.searchsorted(cum, p, side="left")) + 1, c.ids.shape[0])
    c.keep(slice(0, n_keep))


def min_p(c: Candidates, mp: float) -> None:
    """Keep tokens at least mp times as probable as the most probable one."""
    c.keep(c.probs >= mp * c.probs.max())


def typical(c: Candidates, tau: float) -> None:
    """Locally typical sampling: keep the tokens whose surprise is closest to the entropy until their
    mass reaches tau."""
    probs = c.probs.astype(np.float64)
    pos = probs > 0
    logp = np.full_like(probs, -np.inf)
    np.log(probs, where=pos, out=logp)
    entropy = -np.sum(probs[pos] * logp[pos])
    dev = np.abs(-logp - entropy)
    # stable (ties by id) where it is cheap; a full-vocabulary stable sort would cost milliseconds
    order = np.argsort(dev, kind="stable" if dev.shape[0] <= 4096 else None)
    cum = np.cumsum(probs[order])
    n_keep = min(int(np.searchsorted(cum, tau, side="left")) + 1, order.shape[0])
    c.keep(np.sort(order[:n_keep]))  # original order keeps the sorted / ascending-ids invariant


def mirostat_truncate(c: Candidates, mu: float) -> None:
    """Mirostat v2: drop tokens whose surprise -log2(p) exceeds mu (the most probable always stays)."""
    keep = c.probs >= 2.0 ** (-mu)
    keep[np.argmax(c.probs)] = True
    c.keep(keep)


def late_temperature(c: Candidates, temperature: float) -> None:
    """temperature_last: p ** (1/T) over the survivors, computed in log space so nothing underflows."""
    probs = c.probs.astype(np.float64)
    pos = probs > 0
    logp = np.full_like(probs, -np.inf)
    np.log(probs, where=pos, out=logp)
    logp /= temperature
    e = np.exp(logp - logp.max())
    c.probs = e / e.sum()


def xtc(c: Candidates, threshold: float, protected: np.ndarray | None) -> bool:
    """Exclude Top Choices: of the tokens at or above threshold, all but the least probable are removed.

    Needs at least two such tokens; protected ids (stop tokens, newlines) are never removed. Returns
    whether anything was removed. The caller decides (with xtc_probability) whether it triggers.
    """
    above = c.probs >= threshold
    if protected is not None:
        above &= ~protected[c.ids]
    idx = np.flatnonzero(above)
    if idx.shape[0] < 2:
        return False
    least = idx[np.argmin(c.probs[idx])]
    drop = np.zeros(c.ids.shape[0], dtype=bool)
    drop[idx] = True
    drop[least] = False
    c.keep(~drop)
    return True


_BLOCK = 1024


def _inverse_cdf(p: np.ndarray, r: float) -> int:
    """Index where the cumulative mass first exceeds r * total. Long rows go in two levels (block sums,
    then one block) because a float64 cumsum over the whole vocabulary costs more than all the rest."""
    n = p.shape[0]
    if n <= 4 * _BLOCK:
        cum = np.cumsum(p, dtype=np.float64)
        return min(int(np.searchsorted(cum, r * cum[-1], side="right")), n - 1)
    starts = np.arange(0, n, _BLOCK)
    bcum = np.cumsum(np.add.reduceat(p, starts, dtype=np.float64))
    target = r * bcum[-1]
    b = min(int(np.searchsorted(bcum, target, side="right")), bcum.shape[0] - 1)
    base = bcum[b - 1] if b else 0.0
    inner = np.cumsum(p[starts[b]:starts[b] + _BLOCK], dtype=np.float64) + base
    return int(starts[b]) + min(int(np.searchsorted(inner, target, side="right")), inner.shape[0] - 1)


def draw(c: Candidates, r: float, skew: float) -> int:
    """Index into c of the sampled token, by inverse CDF at uniform r in [0, 1).

    Skew bends r toward the tail (skew > 0) or the head (skew < 0) of the descending-sorted distribution,
    as ExLlamaV2 does: r' = r ** exp(-skew).
    """
    if skew != 0.0:
        c.sort()
        r = r ** float(np.exp(-skew))
    i = _inverse_cdf(c.probs, r)
    while i > 0 and c.probs[i] == 0.0:  # rounding can land on a zero-probability (masked) token
        i -= 1
    return i

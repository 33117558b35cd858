"""`JobSampler`: one job's sampler, with its own RNG and state; the settings and their rules are
engine.contract's `SamplerSettings`.

engine.sampling.draw calls `JobSampler.sample()` for each of a job's logits rows in a step. Work happens
on the CPU in numpy: one row is small, so per-op overhead decides the cost, and numpy's is far below
torch's there. Pipeline, as in ExLlamaV2: penalties -> blocked tokens -> token bias -> DRY -> vocab pad
mask -> temperature (unless last) -> top-k -> top-p -> min-p -> typical -> mirostat -> temperature (if
last) -> XTC -> skew -> draw. CFG mixing and draft verification are engine.sampling.draw's; which tokens
are blocked (filters, token healing, banned strings) the job decides.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from . import truncation as trunc
from ..contract.settings import SamplerSettings
from ..contract.settings import as_int as _int
from .penalties import (
    apply_dry,
    ContextCache,
    apply_repetition_penalties,
    bool_table,
    token_ids_for,
)

__all__ = ["SampleResult", "JobSampler"]


@dataclass
class SampleResult:
    token: int
    prob: float  # of the chosen token in the final (processed, truncated) distribution
    top_tokens: list[int] = field(default_factory=list)
    top_probs: list[float] = field(default_factory=list)


def _as_numpy_row(logits: Any, vocab_size: int) -> np.ndarray:
    """The first vocab_size logits as float32 numpy (a view when possible): slicing is the pad mask."""
    if isinstance(logits, torch.Tensor):
        if logits.dim() != 1:
            raise ValueError(f"logits must be 1-D (padded vocab,), got shape {tuple(logits.shape)}")
        t = logits.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype != torch.float32:
            t = t.float()
        arr = t.numpy()
    elif isinstance(logits, np.ndarray):
        if logits.ndim != 1:
            raise ValueError(f"logits must be 1-D (padded vocab,), got shape {logits.shape}")
        arr = logits.astype(np.float32, copy=False)
    else:
        raise ValueError(f"logits must be a torch.Tensor or numpy array, got {type(logits).__name__}")
    if arr.shape[0] < vocab_size:
        raise ValueError(f"logits have {arr.shape[0]} entries, fewer than vocab_size={vocab_size}")
    return arr[:vocab_size]


class JobSampler:
    """One job's sampler. Owns a private RNG (numpy PCG64 seeded from `seed`), so a job's draws depend
    only on its seed and its own logits, never on which other jobs share the batch. Not thread-safe:
    one thread at a time per instance (the pool gives each job to one worker per step). `settings` must
    have passed SamplerSettings.validate() (DynamicJob checks them once, when the request is made)."""

    def __init__(
        self,
        settings: SamplerSettings,
        seed: int | None,
        vocab_size: int,
        stop_token_ids: Iterable[int] = (),
        tokenizer: Any = None,
    ) -> None:
        vocab_size = _int(vocab_size, "vocab_size")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if seed is None:
            seed = secrets.randbits(63)
        seed = _int(seed, "seed")
        self.settings = settings.clone()  # later edits by the caller don't change a running job
        self.seed = seed
        self.vocab_size = vocab_size
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.mirostat_mu: float | None = None  # mirostat v2 state, 2 * tau before the first token
        s = self.settings

        self._bias_ids = self._bias_vals = None
        if s.token_bias:
            bad = [t for t in s.token_bias if t >= vocab_size]
            if bad:
                raise ValueError(f"token_bias ids {bad} are outside the vocabulary (size {vocab_size})")
            self._bias_ids = np.fromiter(s.token_bias.keys(), dtype=np.int64, count=len(s.token_bias))
            self._bias_vals = np.fromiter(s.token_bias.values(), dtype=np.float32, count=len(s.token_bias))

        self._dry_breaker = None
        special = frozenset(getattr(tokenizer, "special_token_ids", None) or ())
        if s.dry_multiplier > 0:
            # Special tokens (chat-turn markers) are structure, like ExLlamaV2's default breakers.
            ids = token_ids_for(s.dry_sequence_breakers, tokenizer, "dry_sequence_breakers") | special
            self._dry_breaker = bool_table(ids, vocab_size)

        self._xtc_protected = None
        if s.xtc_probability > 0:
            # Original XTC never removes newline, end-of-text or special tokens: cutting them makes
            # replies run on.
            protected = set(self.stop_token_ids) | special
            if tokenizer is not None:
                protected |= token_ids_for(["\n"], tokenizer, "xtc newline tokens")
            self._xtc_protected = bool_table(protected, vocab_size)

        self._use_rep = (s.token_repetition_penalty != 1.0 or s.token_frequency_penalty != 0.0
                         or s.token_presence_penalty != 0.0)
        self._rep_window = (-1 if s.token_repetition_range < 0
                            else s.token_repetition_range + s.token_repetition_decay)
        self._use_dry = s.dry_multiplier > 0
        self._greedy = s.is_greedy
        self._ctx = ContextCache()

    # ------------------------------------------------------------------ processing

    def process_logits(self, logits: Any, context: Any, blocked_tokens: Iterable[int] | None = None) -> np.ndarray:
        """Logits after penalties, blocked tokens, bias, DRY and the pad mask: (vocab_size,) float32.

        Returns a view of the input when no stage changes anything (the caller's tensor is never written).
        """
        s = self.settings
        x = _as_numpy_row(logits, self.vocab_size)
        blocked = None
        if blocked_tokens is not None:
            if isinstance(blocked_tokens, np.ndarray):
                blocked = blocked_tokens.astype(np.int64, copy=False)
            else:
                blocked = np.fromiter((int(t) for t in blocked_tokens), dtype=np.int64)
            blocked = blocked[(blocked >= 0) & (blocked < self.vocab_size)]
            if blocked.shape[0] == 0:
                blocked = None
        if not (self._use_rep or self._use_dry or blocked is not None or self._bias_ids is not None):
            return x
        x = x.copy()
        ctx = None
        if self._use_rep or self._use_dry:
            window = self._rep_window if self._use_rep else 0
            if self._use_dry:
                dry_window = s.dry_range if s.dry_range > 0 else -1
                window = -1 if window < 0 or dry_window < 0 else max(window, dry_window)
            ctx = self._ctx.array(context, window)
        if self._use_rep and ctx.shape[0]:
            apply_repetition_penalties(
                x, ctx, s.token_repetition_penalty, s.token_repetition_range, s.token_repetition_decay,
                s.token_frequency_penalty, s.token_presence_penalty,
            )
        if blocked is not None:
            x[blocked] = -np.inf
        if self._bias_ids is not None:
            x[self._bias_ids] += self._bias_vals
        if self._use_dry and ctx.shape[0]:
            dctx = ctx if s.dry_range <= 0 or ctx.shape[0] <= s.dry_range else ctx[-s.dry_range:]
            apply_dry(x, dctx, self._dry_breaker, s.dry_multiplier, s.dry_base,
                      s.dry_allowed_length, s.dry_max_ngram)
        return x

    # ------------------------------------------------------------------ sampling

    def sample(
        self,
        logits: Any,
        context: Sequence[int] | np.ndarray | torch.Tensor = (),
        return_top_tokens: int = 0,
        blocked_tokens: Iterable[int] | None = None,
    ) -> SampleResult:
        """Pick the next token from one (padded) logits row; `context` is prompt + generated ids so far."""
        k_top = _int(return_top_tokens, "return_top_tokens")
        if not 0 <= k_top <= self.vocab_size:
            raise ValueError(f"return_top_tokens must be in [0, {self.vocab_size}], got {k_top}")
        x = self.process_logits(logits, context, blocked_tokens)
        if self._greedy:
            return self._sample_greedy(x, k_top)
        return self._sample_random(x, k_top)

    def _sample_greedy(self, x: np.ndarray, k_top: int) -> SampleResult:
        tok = int(np.argmax(x))  # first maximum: ties go to the lowest id
        v = x[tok]
        if np.isnan(v):
            raise ValueError("logits contain NaN")
        if v == -np.inf:
            raise ValueError("every token is masked (-inf): nothing can be sampled")
        if self.settings.mirostat:
            self._mirostat_update(1.0)
        tops, probs = [], []
        if k_top:
            tops = [tok] + self._best_rest(x, [tok], k_top - 1)
            probs = [1.0] + [0.0] * (k_top - 1)
        return SampleResult(tok, 1.0, tops, probs)

    def _sample_random(self, x: np.ndarray, k_top: int) -> SampleResult:
        s = self.settings
        m = x.max()
        if np.isnan(m):
            raise ValueError("logits contain NaN")
        if m == -np.inf:
            raise ValueError("every token is masked (-inf): nothing can be sampled")
        if m == np.inf:  # a penalty or bias overflowed: the +inf tokens alone are candidates, equally likely
            x = np.where(x == np.inf, np.float32(0.0), np.float32(-np.inf))
        t_first = 1.0 if s.temperature_last else s.temperature
        c = trunc.initial(x, t_first, s.top_k)
        if s.top_p < 1.0 and c.ids.shape[0] > 1:
            trunc.top_p(c, s.top_p)
        if s.min_p > 0.0 and c.ids.shape[0] > 1:
            trunc.min_p(c, s.min_p)
        if s.typical < 1.0 and c.ids.shape[0] > 1:
            trunc.typical(c, s.typical)
        if s.mirostat and c.ids.shape[0] > 1:
            trunc.mirostat_truncate(c, self._mu())
        if s.temperature_last and s.temperature != 1.0 and c.ids.shape[0] > 1:
            trunc.late_temperature(c, s.temperature)
        if s.xtc_probability > 0.0:
            if self.rng.random() < s.xtc_probability and c.ids.shape[0] > 1:
                trunc.xtc(c, s.xtc_threshold, self._xtc_protected)
        i = trunc.draw(c, self.rng.random(), s.skew)
        tok, prob = int(c.ids[i]), float(c.probs[i])
        if s.mirostat:
            self._mirostat_update(prob)
        tops, probs = [], []
        if k_top:
            tops, probs = c.top(k_top)
            if len(tops) < k_top:
                tops += self._best_rest(x, tops, k_top - len(tops))
                probs += [0.0] * (k_top - len(probs))
        return SampleResult(tok, prob, tops, probs)

    # ------------------------------------------------------------------ state

    def _mu(self) -> float:
        if self.mirostat_mu is None:
            self.mirostat_mu = 2.0 * self.settings.mirostat_tau
        return self.mirostat_mu

    def _mirostat_update(self, prob: float) -> None:
        """mu moves toward the target surprise tau by eta times the error of the token just chosen."""
        s = self.settings
        surprise = -math.log2(max(prob, 1e-45))
        self.mirostat_mu = self._mu() + s.mirostat_eta * (s.mirostat_tau - surprise)

    @staticmethod
    def _best_rest(x: np.ndarray, taken: list[int], n: int) -> list[int]:
        """The n highest-logit ids not in `taken` (fills top-token lists past the candidate set, prob 0)."""
        if n <= 0:
            return []
        want = min(n + len(taken), x.shape[0])
        idx = np.argpartition(x, x.shape[0] - want)[x.shape[0] - want:]
        idx = idx[np.lexsort((idx, -x[idx]))]
        skip = set(taken)
        return [int(i) for i in idx if int(i) not in skip][:n]

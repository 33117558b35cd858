"""Sampling: `SamplerSettings` (ExLlamaV2's names and defaults), `JobSampler` (one job's sampler with its
own RNG and state) and `SamplingPool` (the per-step thread pool).

The generator calls `JobSampler.sample()` once per job per step with that job's logits row. Work happens
on the CPU in numpy: one row is small, so per-op overhead decides the cost, and numpy's is far below
torch's there. Pipeline, as in ExLlamaV2: penalties -> blocked tokens -> token bias -> DRY -> vocab pad
mask -> temperature (unless last) -> top-k -> top-p -> min-p -> typical -> mirostat -> temperature (if
last) -> XTC -> skew -> draw. CFG mixing, filters and token healing are the generator's.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from . import sampling_truncation as trunc
from .sampling_penalties import (
    apply_dry,
    ContextCache,
    apply_repetition_penalties,
    bool_table,
    token_ids_for,
)
from .sampling_pool import SamplingPool

__all__ = ["SamplerSettings", "SampleResult", "JobSampler", "SamplingPool"]

GREEDY_TEMPERATURE = 0.01  # below this, sampling is argmax (ExLlamaV2's rule)


def _num(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {value!r}")
    return int(value)


def _check(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid: {rule}")


@dataclass
class SamplerSettings:
    """Sampler knobs with ExLlamaV2's names and defaults. Neutral values switch a stage off: top_k 0,
    top_p 1, min_p 0, typical 1, penalties 1/0, dry_multiplier 0, xtc_probability 0, skew 0."""

    temperature: float = 0.8  # below 0.01: greedy (ExLlamaV2's rule), whatever temperature_last says
    top_k: int = 50
    top_p: float = 0.8
    min_p: float = 0.0
    typical: float = 1.0
    token_repetition_penalty: float = 1.025
    token_repetition_range: int = -1  # -1: the whole context
    token_repetition_decay: int = 0
    token_frequency_penalty: float = 0.0
    token_presence_penalty: float = 0.0
    token_bias: dict[int, float] | None = None
    temperature_last: bool = False
    skew: float = 0.0
    mirostat: bool = False
    mirostat_tau: float = 1.5
    mirostat_eta: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_sequence_breakers: list[str | int] = field(default_factory=lambda: ["\n", ":", '"', "*"])
    dry_range: int = 0  # 0: the whole context
    dry_max_ngram: int = 20
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    cfg_scale: float | None = None  # mixed by the generator (two sequences), not here

    @classmethod
    def greedy(cls, **overrides: Any) -> SamplerSettings:
        """Argmax decoding: top_k 1, temperature 0, no penalties (overrides apply on top)."""
        base = dict(temperature=0.0, top_k=1, top_p=1.0, token_repetition_penalty=1.0)
        base.update(overrides)
        return cls(**base)

    @property
    def is_greedy(self) -> bool:
        return self.top_k == 1 or self.temperature < GREEDY_TEMPERATURE

    def clone(self) -> SamplerSettings:
        return replace(
            self,
            token_bias=None if self.token_bias is None else dict(self.token_bias),
            dry_sequence_breakers=list(self.dry_sequence_breakers),
        )

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        known = {f.name for f in fields(self)}
        extra = set(vars(self)) - known
        if extra:
            raise ValueError(f"unknown sampler settings {sorted(extra)}")
        t = _num(self.temperature, "temperature")
        _check(0.0 <= t < math.inf, "temperature", t, "must be finite and >= 0 (0 = greedy)")
        k = _int(self.top_k, "top_k")
        _check(k >= 0, "top_k", k, "must be >= 0 (0 = off)")
        p = _num(self.top_p, "top_p")
        _check(0.0 < p <= 1.0, "top_p", p, "must be in (0, 1] (1 = off)")
        mp = _num(self.min_p, "min_p")
        _check(0.0 <= mp <= 1.0, "min_p", mp, "must be in [0, 1] (0 = off)")
        ty = _num(self.typical, "typical")
        _check(0.0 < ty <= 1.0, "typical", ty, "must be in (0, 1] (1 = off)")
        rp = _num(self.token_repetition_penalty, "token_repetition_penalty")
        _check(0.0 < rp < math.inf, "token_repetition_penalty", rp, "must be finite and > 0 (1 = off)")
        rr = _int(self.token_repetition_range, "token_repetition_range")
        _check(rr >= -1, "token_repetition_range", rr, "must be >= 0, or -1 for the whole context")
        rd = _int(self.token_repetition_decay, "token_repetition_decay")
        _check(rd >= 0, "token_repetition_decay", rd, "must be >= 0")
        for name in ("token_frequency_penalty", "token_presence_penalty"):
            v = _num(getattr(self, name), name)
            _check(-2.0 <= v <= 2.0, name, v, "must be in [-2, 2] (OpenAI's range; 0 = off)")
        if self.token_bias is not None:
            if not isinstance(self.token_bias, dict):
                raise ValueError(f"token_bias must be a dict {{token_id: bias}} or None, got {self.token_bias!r}")
            for tok, b in self.token_bias.items():
                _check(not isinstance(tok, bool) and isinstance(tok, (int, np.integer)) and tok >= 0,
                       "token_bias", tok, "keys must be token ids >= 0")
                bv = _num(b, f"token_bias[{tok}]")
                _check(bv < math.inf, f"token_bias[{tok}]", bv, "must be finite or -inf (ban)")
        for name in ("temperature_last", "mirostat"):
            _check(isinstance(getattr(self, name), bool), name, getattr(self, name), "must be a bool")
        sk = _num(self.skew, "skew")
        _check(abs(sk) < math.inf, "skew", sk, "must be finite")
        tau = _num(self.mirostat_tau, "mirostat_tau")
        _check(0.0 < tau < math.inf, "mirostat_tau", tau, "must be finite and > 0")
        eta = _num(self.mirostat_eta, "mirostat_eta")
        _check(0.0 <= eta < math.inf, "mirostat_eta", eta, "must be finite and >= 0")
        dm = _num(self.dry_multiplier, "dry_multiplier")
        _check(0.0 <= dm < math.inf, "dry_multiplier", dm, "must be finite and >= 0 (0 = off)")
        db = _num(self.dry_base, "dry_base")
        _check(1.0 <= db < math.inf, "dry_base", db, "must be finite and >= 1")
        dal = _int(self.dry_allowed_length, "dry_allowed_length")
        _check(dal >= 1, "dry_allowed_length", dal, "must be >= 1")
        dr = _int(self.dry_range, "dry_range")
        _check(dr >= 0, "dry_range", dr, "must be >= 0 (0 = whole context)")
        dmn = _int(self.dry_max_ngram, "dry_max_ngram")
        _check(dmn >= 1, "dry_max_ngram", dmn, "must be >= 1")
        if dm > 0:
            _check(dmn >= dal, "dry_max_ngram", dmn,
                   f"must be >= dry_allowed_length ({dal}) or DRY can never trigger")
        brk = self.dry_sequence_breakers
        _check(isinstance(brk, (list, tuple, set, frozenset)), "dry_sequence_breakers", brk,
               "must be a list of strings or token ids")
        for b in brk:
            _check((isinstance(b, str) and len(b) > 0)
                   or (isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 0),
                   "dry_sequence_breakers", b, "entries must be non-empty strings or token ids >= 0")
        xp = _num(self.xtc_probability, "xtc_probability")
        _check(0.0 <= xp <= 1.0, "xtc_probability", xp, "must be in [0, 1] (0 = off)")
        xt = _num(self.xtc_threshold, "xtc_threshold")
        _check(0.0 <= xt <= 1.0, "xtc_threshold", xt, "must be in [0, 1]")
        if self.cfg_scale is not None:
            cs = _num(self.cfg_scale, "cfg_scale")
            _check(abs(cs) < math.inf, "cfg_scale", cs, "must be finite or None")


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
    one thread at a time per instance (the pool gives each job to one worker per step)."""

    def __init__(
        self,
        settings: SamplerSettings,
        seed: int | None,
        vocab_size: int,
        stop_token_ids: Iterable[int] = (),
        tokenizer: Any = None,
    ) -> None:
        settings.validate()
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

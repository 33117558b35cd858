"""`SamplerSettings`: the sampler's knobs with ExLlamaV2's names and defaults, and the one set of rules
(`validate()`) every entry point checks them with: DynamicJob, the CLI and the app's chat settings.

Torch- and numpy-free so the app can validate a chat's settings without loading the engine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from numbers import Integral
from typing import Any

GREEDY_TEMPERATURE = 0.01  # below this, sampling is argmax (ExLlamaV2's rule)


class InvalidSetting(ValueError):
    """validate()'s error. The message starts with the setting's name (`token_bias[5]` for one entry);
    `field` is the SamplerSettings field, so a caller with other names for the fields (the server's
    OpenAI parameters) can say which parameter is at fault."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.field = name.split("[", 1)[0]


def _num(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise InvalidSetting(name, f"{name} must be a number, got {value!r}")
    return float(value)


def as_int(value: Any, name: str) -> int:
    """value as an int (numpy integers too, never bool); a ValueError (InvalidSetting) naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidSetting(name, f"{name} must be an int, got {value!r}")
    return int(value)


def _check(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise InvalidSetting(name, f"{name}={value!r} is invalid: {rule}")


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
        """Raise InvalidSetting (a ValueError) naming the first invalid field."""
        known = {f.name for f in fields(self)}
        extra = set(vars(self)) - known
        if extra:
            raise InvalidSetting(sorted(extra)[0], f"unknown sampler settings {sorted(extra)}")
        t = _num(self.temperature, "temperature")
        _check(0.0 <= t < math.inf, "temperature", t, "must be finite and >= 0 (0 = greedy)")
        k = as_int(self.top_k, "top_k")
        _check(k >= 0, "top_k", k, "must be >= 0 (0 = off)")
        p = _num(self.top_p, "top_p")
        _check(0.0 < p <= 1.0, "top_p", p, "must be in (0, 1] (1 = off)")
        mp = _num(self.min_p, "min_p")
        _check(0.0 <= mp <= 1.0, "min_p", mp, "must be in [0, 1] (0 = off)")
        ty = _num(self.typical, "typical")
        _check(0.0 < ty <= 1.0, "typical", ty, "must be in (0, 1] (1 = off)")
        rp = _num(self.token_repetition_penalty, "token_repetition_penalty")
        _check(0.0 < rp < math.inf, "token_repetition_penalty", rp, "must be finite and > 0 (1 = off)")
        rr = as_int(self.token_repetition_range, "token_repetition_range")
        _check(rr >= -1, "token_repetition_range", rr, "must be >= 0, or -1 for the whole context")
        rd = as_int(self.token_repetition_decay, "token_repetition_decay")
        _check(rd >= 0, "token_repetition_decay", rd, "must be >= 0")
        for name in ("token_frequency_penalty", "token_presence_penalty"):
            v = _num(getattr(self, name), name)
            _check(-2.0 <= v <= 2.0, name, v, "must be in [-2, 2] (OpenAI's range; 0 = off)")
        if self.token_bias is not None:
            if not isinstance(self.token_bias, dict):
                raise InvalidSetting("token_bias", f"token_bias must be a dict {{token_id: bias}} or None, got {self.token_bias!r}")
            for tok, b in self.token_bias.items():
                _check(not isinstance(tok, bool) and isinstance(tok, Integral) and tok >= 0,
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
        dal = as_int(self.dry_allowed_length, "dry_allowed_length")
        _check(dal >= 1, "dry_allowed_length", dal, "must be >= 1")
        dr = as_int(self.dry_range, "dry_range")
        _check(dr >= 0, "dry_range", dr, "must be >= 0 (0 = whole context)")
        dmn = as_int(self.dry_max_ngram, "dry_max_ngram")
        _check(dmn >= 1, "dry_max_ngram", dmn, "must be >= 1")
        if dm > 0:
            _check(dmn >= dal, "dry_max_ngram", dmn,
                   f"must be >= dry_allowed_length ({dal}) or DRY can never trigger")
        brk = self.dry_sequence_breakers
        _check(isinstance(brk, (list, tuple, set, frozenset)), "dry_sequence_breakers", brk,
               "must be a list of strings or token ids")
        for b in brk:
            _check((isinstance(b, str) and len(b) > 0)
                   or (isinstance(b, Integral) and not isinstance(b, bool) and b >= 0),
                   "dry_sequence_breakers", b, "entries must be non-empty strings or token ids >= 0")
        xp = _num(self.xtc_probability, "xtc_probability")
        _check(0.0 <= xp <= 1.0, "xtc_probability", xp, "must be in [0, 1] (0 = off)")
        xt = _num(self.xtc_threshold, "xtc_threshold")
        _check(0.0 <= xt <= 1.0, "xtc_threshold", xt, "must be in [0, 1]")
        if self.cfg_scale is not None:
            cs = _num(self.cfg_scale, "cfg_scale")
            _check(abs(cs) < math.inf, "cfg_scale", cs, "must be finite or None")

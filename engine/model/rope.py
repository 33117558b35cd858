"""Rotary position embeddings: each scaling scheme's frequencies, read from an HF config or GGUF metadata and
computed exactly as transformers does (default, linear, llama3, LongRoPE, YaRN) or as llama.cpp stores them
(a rope_freqs tensor of per-frequency divisors; LongRoPE's short/long factor tensors; YaRN's metadata keys).

A scaling is one dict, {"rope_type": ..., parameters}, so ModelConfig stays a flat record of facts.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "freq_factors", "longrope", "yarn")


def unsupported_rope(kind: Any) -> NotImplementedError:
    return NotImplementedError(
        f"RoPE scaling type {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")


def inv_freq(dim: int, theta: float, scaling: dict | None, long: bool = False) -> torch.Tensor:
    """Inverse frequencies (float32, dim // 2) for rotary dims `dim`. LongRoPE has two sets: the short
    factors for contexts up to original_max_position_embeddings, the long ones beyond (long=True)."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    kind = scaling["rope_type"] if scaling else "default"
    if kind == "longrope":  # transformers' own expression, to match it bit for bit
        factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
        _check_len(factors, dim // 2, "longrope factors")
        return 1.0 / (factors * theta ** exponents)
    base = 1.0 / (theta ** exponents)
    if kind == "default":
        return base
    if kind == "linear":
        return base / float(scaling["factor"])
    if kind == "freq_factors":  # llama.cpp's rope_freqs tensor: per-frequency divisors
        factors = torch.tensor(scaling["factors"], dtype=torch.float32)
        _check_len(factors, dim // 2, "rope freq factors")
        return base / factors
    if kind == "llama3":  # long wavelengths divided by factor, short kept, a smooth blend in between
        factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / base
        scaled = torch.where(wavelen > low_wavelen, base / factor, base)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    if kind == "yarn":
        return _yarn_inv_freq(dim, theta, scaling)
    raise unsupported_rope(kind)


def _yarn_inv_freq(dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """YaRN: frequencies that turn fewer than beta_slow times over the original context are divided by
    factor, those turning more than beta_fast times are kept, a linear ramp over the dims between blends
    the two. `truncate` rounds the ramp's ends to whole dims (llama.cpp always does; gpt-oss's config
    says not to). transformers' expression, step for step."""
    factor, original = float(scaling["factor"]), float(scaling["original_max_position_embeddings"])
    beta_fast, beta_slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of one point
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # the share of each frequency left unscaled
    return interpolation * (1 - keep) + extrapolation * keep


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's default cos/sin multiplier: 0.1 ln(factor) + 1 (a ratio of two such terms where the config
    names mscale and mscale_all_dim), as transformers and llama.cpp compute it."""
    def get(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return get(factor, mscale) / get(factor, mscale_all_dim)
    return get(factor)


def attention_factor(scaling: dict | None) -> float:
    """What cos and sin are multiplied by (LongRoPE's and YaRN's mscale); 1 for every other scheme."""
    return float(scaling.get("attention_factor", 1.0)) if scaling else 1.0


def _check_len(factors: torch.Tensor, n: int, what: str) -> None:
    if factors.numel() != n:
        raise ValueError(f"{what} have {factors.numel()} entries, expected {n}")


# ---------------------------------------------------------------- HF config.json

def hf_rope(params: dict, cfg: dict) -> tuple[float, dict | None]:
    """(rope_theta, scaling) from one rope-parameter dict (v5 `rope_parameters`, or v4 `rope_scaling` plus
    the top-level rope_theta); `cfg` supplies max_position_embeddings and LongRoPE's original length."""
    params = dict(params)
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    params.pop("partial_rotary_factor", None)
    if kind == "su":  # Phi-3's old name for LongRoPE
        kind = "longrope"
    if kind == "default":
        return theta, None
    if kind not in SUPPORTED_ROPE_TYPES:
        raise unsupported_rope(kind)
    if kind == "llama3":
        params.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
        _require(params, kind, "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    if kind == "linear":
        _require(params, kind, "factor")
    if kind == "longrope":
        params.setdefault("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
        _require(params, kind, "short_factor", "long_factor", "original_max_position_embeddings")
        original = float(params["original_max_position_embeddings"])
        factor = params.get("factor") or float(cfg.get("max_position_embeddings", original)) / original
        if params.get("attention_factor") is None:  # transformers' default: sqrt(1 + ln(s) / ln(L0))
            params["attention_factor"] = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    if kind == "yarn":  # transformers' default original length: the config's own
        params.setdefault("original_max_position_embeddings",
                          cfg.get("original_max_position_embeddings") or cfg.get("max_position_embeddings"))
        _require(params, kind, "original_max_position_embeddings")
        if params.get("factor") is None:
            params["factor"] = float(cfg["max_position_embeddings"]) / float(params["original_max_position_embeddings"])
        if params.get("attention_factor") is None:
            params["attention_factor"] = yarn_attention_factor(float(params["factor"]), params.get("mscale"),
                                                               params.get("mscale_all_dim"))
    return theta, {"rope_type": kind, **params}


def _require(params: dict, kind: str, *keys: str) -> None:
    missing = sorted(k for k in keys if params.get(k) is None)
    if missing:
        raise ValueError(f"{kind} rope scaling is missing {missing}")


# ---------------------------------------------------------------- GGUF metadata

def gguf_rope(meta: dict, arch: str, tensor_values) -> dict | None:
    """The scaling of a GGUF file; tensor_values(name) reads a small float tensor (or None if absent)."""
    long, short = tensor_values("rope_factors_long.weight"), tensor_values("rope_factors_short.weight")
    if long is not None and short is not None:
        original = meta.get(f"{arch}.rope.scaling.original_context_length")
        if original is None:
            raise ValueError(f"GGUF has LongRoPE factors but no {arch}.rope.scaling.original_context_length")
        return {"rope_type": "longrope", "short_factor": short, "long_factor": long,
                "original_max_position_embeddings": int(original),
                "attention_factor": float(meta.get(f"{arch}.rope.scaling.attn_factor", 1.0))}
    factors = tensor_values("rope_freqs.weight")
    if factors is not None:
        return {"rope_type": "freq_factors", "factors": factors}
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind in ("none", None):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    if kind == "yarn":
        return gguf_yarn(meta, arch)
    raise NotImplementedError(f"GGUF rope scaling type {kind!r} is not supported (only none, linear, yarn, "
                              "rope_freqs, LongRoPE factors)")


def gguf_yarn(meta: dict, arch: str) -> dict:
    """YaRN as llama.cpp runs it from a GGUF: the ramp's ends rounded to whole dims (truncate), cos and sin
    times yarn_attn_factor (default 1) * (0.1 ln(factor) + 1)."""
    def key(name: str, default=None):
        value = meta.get(f"{arch}.rope.scaling.{name}", default)
        if value is None:
            raise ValueError(f"GGUF has YaRN rope scaling but no {arch}.rope.scaling.{name}")
        return value

    factor = float(key("factor"))
    return {"rope_type": "yarn", "factor": factor,
            "original_max_position_embeddings": int(key("original_context_length")),
            "beta_fast": float(key("yarn_beta_fast", 32.0)), "beta_slow": float(key("yarn_beta_slow", 1.0)),
            "truncate": True, "attention_factor": float(key("yarn_attn_factor", 1.0)) * yarn_attention_factor(factor)}

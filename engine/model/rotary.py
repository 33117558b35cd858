"""The rotation one forward applies, built for a context length and owned by whoever runs the steps.

LongRoPE (Phi-3) has a short-context factor set, exact up to its original length, and a long one beyond.
The set is chosen per context (as llama.cpp does), never per step, so cached keys and later queries always
share one rotation. A Model is shared by generators with different context lengths, so the choice is never
model state: each generator builds its Rotary once and passes it to every Model.forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import ModelConfig


@dataclass(frozen=True)
class Rotary:
    inv_freq: torch.Tensor  # float32 (dims // 2,): the global layers' inverse frequencies
    sliding_inv_freq: torch.Tensor | None  # the sliding layers' own base (Gemma 3), else None
    attention_factor: float  # what cos and sin are multiplied by (LongRoPE's mscale)
    dims: int  # rotated dims of each head (partial rotary rotates the first ones)
    long: bool  # LongRoPE's long factor set

    @classmethod
    def for_context(cls, config: ModelConfig, device: torch.device, n: int) -> "Rotary":
        """The rotation for sequences up to n tokens (the long LongRoPE set past its original length)."""
        threshold = config.long_rope_threshold
        long = threshold is not None and n > threshold
        sliding = (config.sliding_rope_inv_freq().to(device=device, dtype=torch.float32)
                   if config.sliding_rope_theta is not None else None)
        return cls(config.rope_inv_freq(long=long).to(device=device, dtype=torch.float32), sliding,
                   config.rope_attention_factor, config.rotary_dims, long)

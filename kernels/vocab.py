"""Vocabulary padding: the output projection runs on a row count that is a multiple of 32 (aligned
tiles on the GPU); the padded logits are never sampled (the sampler reads only the first vocab_size)."""

from __future__ import annotations

import torch

VOCAB_ALIGN = 32


def pad_vocab(n: int) -> int:
    """Smallest multiple of 32 that holds `n` vocabulary rows."""
    if n < 1:
        raise ValueError(f"vocabulary size must be positive, got {n}")
    return ((n + VOCAB_ALIGN - 1) // VOCAB_ALIGN) * VOCAB_ALIGN


def pad_embedding(weight: torch.Tensor) -> torch.Tensor:
    """Zero rows appended to a (vocab, hidden) output projection up to pad_vocab(vocab)."""
    n = weight.shape[0]
    extra = pad_vocab(n) - n
    if extra == 0:
        return weight
    return torch.cat([weight, weight.new_zeros(extra, *weight.shape[1:])], dim=0)

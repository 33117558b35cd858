"""Vocabulary padding: the output projection runs on a row count that is a multiple of 32 (aligned
tiles on the GPU); the padded logits must never be sampled, so they are masked to -inf."""

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


def mask_padded_logits(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Padded columns set to -inf in place so no sampler can pick a token that does not exist."""
    if logits.shape[-1] < vocab_size:
        raise ValueError(f"logits have {logits.shape[-1]} columns, fewer than the vocabulary ({vocab_size})")
    if logits.shape[-1] > vocab_size:
        logits[..., vocab_size:] = float("-inf")
    return logits

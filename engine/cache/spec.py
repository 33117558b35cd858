"""What a K/V cache must match in the model it serves: the pools' shape, element type and device.

A cache is built from this record, never from the model (the model builds one: Model.cache_spec()), so the
cache sits below the model and a generator refuses a cache whose spec differs from its model's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype  # of unquantized pools (a quantized cache stores its own codes and scales)
    device: torch.device

    def check_serves(self, other: "CacheSpec", what: str = "the cache") -> None:
        """Raise ValueError unless a cache built from `self` fits a model whose spec is `other`."""
        if self != other:
            raise ValueError(f"{what} was built for a different model: {self.describe()} vs the model's "
                             f"{other.describe()}")

    def describe(self) -> str:
        return (f"{self.num_layers} layers x {self.num_kv_heads} K/V heads x {self.head_dim} dims, "
                f"{str(self.dtype).removeprefix('torch.')} on {self.device}")

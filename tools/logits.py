"""Logits for every position of one sequence, in one forward through a throwaway cache: what tests and
scripts compare with a peer (transformers, a training loop) or with another weight format.

The rotation is the one transformers picks for a pass over n tokens (LongRoPE's long set past its original
length), unless `rotary` says otherwise.
"""
from __future__ import annotations

import torch

from engine.cache.paged_cache import PagedCache
from engine.model.batch import Batch
from engine.model.lora import LoRAApply
from engine.model.model import Model
from engine.model.rotary import Rotary

PAGE = 16


def forward_tokens(model: Model, input_ids: torch.Tensor, lora: LoRAApply | None = None,
                   rotary: Rotary | None = None, prompt: bool = True) -> torch.Tensor:
    """(n, vocab_size) float32 logits of the token ids (any shape holding one sequence, e.g. (1, n)). prompt=False
    feeds them as generated tokens: a model with dense prompt rows then multiplies them with its packed kernels,
    as decode steps do."""
    ids = input_ids.reshape(-1).tolist()
    cache = PagedCache(model, max_tokens=max(PAGE, -(-len(ids) // PAGE) * PAGE), page_size=PAGE)
    batch = Batch.build([(ids, 0, list(range(cache.num_pages)))], PAGE, [len(ids)], model.device, [prompt])
    rotary = rotary if rotary is not None else model.rotary_for(len(ids))
    return model.forward(batch, cache, lora, rotary)[:, : model.vocab_size]

"""Bidirectional attention inside an image's run of embedding rows (Gemma 3).

Gemma 3 lets the tokens of one image attend to each other both ways (transformers builds the mask from
token_type_ids: OR(causal, same image block), ANDed with the sliding window on local layers; llama.cpp
decodes image chunks non-causally for the same reason). The paged attention kernels are causal only, so
after they ran, the rows of each such run are recomputed here with the wider mask: a query at position p
of a run ending at position e sees keys at positions [0, e) (minus those a sliding window hides:
key > p - window). The step must hold the whole run's K/V, which the generator's chunking guarantees (a
prefill chunk never ends inside a run).
"""
from __future__ import annotations

import torch

from .batch import Batch


def attend_blocks(o: torch.Tensor, q: torch.Tensor, k_pool, v_pool, batch: Batch, page_size: int,
                  scale: float, window: int | None, softcap: float | None) -> None:
    """Overwrite o's rows (T, Hq, D) of batch.mm_blocks with attention under the image-block mask.

    q: the step's rotated queries (T, Hq, D); k_pool / v_pool: this layer's plain cache pools
    (num_pages, page_size, Hkv, D), already holding every run's K/V."""
    if not isinstance(k_pool, torch.Tensor):
        raise NotImplementedError("bidirectional image attention reads plain K/V pools; a quantized K/V cache "
                                  "(kv_quant) is not supported with Gemma 3 images")
    hq, hkv = q.shape[1], k_pool.shape[2]
    for b, row0, row1, kv_end in batch.mm_blocks:
        n_pages = -(-kv_end // page_size)
        pages = batch.block_table[b, :n_pages].long()
        k = k_pool.index_select(0, pages).flatten(0, 1)[:kv_end].float()  # (kv_end, Hkv, D)
        v = v_pool.index_select(0, pages).flatten(0, 1)[:kv_end].float()
        if hq != hkv:
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
        qb = q[row0:row1].float()  # (n, Hq, D)
        scores = torch.einsum("nhd,khd->hnk", qb, k) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if window is not None:
            pos = batch.positions[row0:row1].unsqueeze(1)  # (n, 1)
            keys = torch.arange(kv_end, device=pos.device).unsqueeze(0)  # (1, kv_end)
            scores = scores.masked_fill(~(keys > pos - window), float("-inf"))
        out = torch.einsum("hnk,khd->nhd", scores.softmax(dim=-1), v)
        o[row0:row1] = out.to(o.dtype)

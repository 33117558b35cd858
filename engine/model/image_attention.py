"""Bidirectional attention inside an image's run of embedding rows (Gemma 3).

Gemma 3 lets the tokens of one image attend to each other both ways (transformers builds the mask from
token_type_ids: OR(causal, same image block), ANDed with the sliding window on local layers; llama.cpp
decodes image chunks non-causally for the same reason). The paged attention kernels are causal only, so
after they ran, the rows of each such run are recomputed here with the wider mask: a query at position p
of a run ending at position e sees keys at positions [0, e) (minus those a sliding window hides:
key > p - window). The step must hold the whole run's K/V, which the generator's chunking guarantees (a
prefill chunk never ends inside a run). A quantized K/V cache (kv_quant) is read back dequantized (in the
basis it was written in), so those rows see the same K/V the causal kernel saw.
"""
from __future__ import annotations

import torch

from .batch import Batch


def attend_blocks(o: torch.Tensor, q: torch.Tensor, k_pool, v_pool, batch: Batch, page_size: int,
                  scale: float, window: int | None, softcap: float | None) -> None:
    """Overwrite o's rows (T, Hq, D) of batch.mm_blocks with attention under the image-block mask.

    q: the step's rotated queries (T, Hq, D); k_pool / v_pool: this layer's cache pools, plain
    (num_pages, page_size, Hkv, D) tensors or kernels.kv_quant.QuantizedPool, already holding every run's K/V."""
    hq, hkv = q.shape[1], k_pool.shape[2]
    for b, row0, row1, kv_end in batch.mm_blocks:
        n_pages = -(-kv_end // page_size)
        pages = batch.block_table[b, :n_pages].long()
        k = _pages(k_pool, pages)[:kv_end]  # (kv_end, Hkv, D) float32
        v = _pages(v_pool, pages)[:kv_end]
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


def _pages(pool, pages: torch.Tensor) -> torch.Tensor:
    """A pool's pages as float32 (n * page_size, H, D): a plain tensor's rows, or a quantized pool's
    dequantized and un-rotated (QuantizedPool.gather)."""
    if isinstance(pool, torch.Tensor):
        return pool.index_select(0, pages).flatten(0, 1).float()
    return pool.gather(pages, torch.float32).flatten(0, 1)

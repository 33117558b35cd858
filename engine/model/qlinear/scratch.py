"""The reused fp32 buffer that just-in-time dense weights are decoded into (engine.model.qlinear.dense_product).

A small model's prompt rows multiply its exact dense weights; instead of keeping an fp32 copy of every
packed matrix (the default model: ~5.5x its file resident), each matrix is decoded into this buffer right
before its F.linear. One buffer per thread, grown to the largest matrix asked for up to MAX_WEIGHTS; a
wider one (a tied 49152-row output head) is decoded in slabs of rows that fill it.
"""
from __future__ import annotations

import threading

import torch

MAX_WEIGHTS = 4 << 20  # 16 MB of fp32: a 135M model's fused gate|up (3072 x 576) whole, its head in slabs

_local = threading.local()


def get(weights: int) -> torch.Tensor:
    """A flat fp32 buffer of `weights` values or more (callers ask for at most MAX_WEIGHTS, or one slab of 64
    rows of a very wide matrix), this thread's, reused across calls."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < weights:
        with torch.inference_mode(False):  # a normal tensor: writable in and out of inference mode alike
            buf = _local.buf = torch.empty(weights, dtype=torch.float32)
    return buf


def nbytes() -> int:
    """The most a thread's buffer holds (the memory estimate adds it once where prompts decode on the fly)."""
    return MAX_WEIGHTS * 4

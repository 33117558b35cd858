"""What the K-quant formats' oracles share (tests/kernels/test_q4k.py, test_q5k.py, test_q6.py): llama.cpp's Q8_K
activations as activations.h's quantize_k makes them, and a correctly rounded fp32 fma, so that a NumPy
statement of a kernel's arithmetic can be compared to the bit."""
from __future__ import annotations

import numpy as np
import torch


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fp32 fma(a, b, c), correctly rounded: a * b is exact in float64, the sum is rounded to odd in float64
    (TwoSum's error decides the last bit) and then to float32, which is the single rounding of the exact value."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c = c.astype(np.float64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def q8_k(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_K activations as activations.h's quantize_k: per 256 d = max|x| / 127, codes rint(x * (127 / max|x|)), and the
    integer code sums of each 32."""
    v = x.numpy().astype(np.float32).reshape(x.shape[0], -1, 256)
    amax = np.abs(v).max(-1)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(v * inv[..., None]).astype(np.int64)
    return q, (amax / np.float32(127)).astype(np.float32), q.reshape(*q.shape[:2], 8, 32).sum(-1)

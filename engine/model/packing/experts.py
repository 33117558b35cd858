"""A GGUF's 3-D expert tensors (llama.cpp's blk.{i}.ffn_{gate,up,down}_exps: (experts, rows, cols) in ggml
blocks) packed one expert at a time into the same kernel formats the dense matrices take
(engine.model.packing.repack.from_blocks), never dequantized whole.

ggml stores the experts outermost, so expert e's (rows, cols) matrix is one contiguous byte range of the
file: its rows are sliced from the mapped tensor and packed tile by tile like any 2-D matrix, and each
tile's file pages are dropped once read. Loading a tensor so holds what is built so far plus one tile of
file pages (a Qwen3-30B-A3B Q4_K_M file, ~18 GB, loads in about its own size; dequantized to fp32 it
needed ~120 GB). Each expert's packed matrix is exact for the types the kernels hold exactly (Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, Q4_K, Q6_K) and re-quantized to Q8_0 otherwise, the dense matrices' rule.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from gguf import GGMLQuantizationType

from ..qlinear import PackedLinear
from . import repack
from .readahead import read_ahead

def pack_stack(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int, int], fmt: str,
               keep_dense: bool, drop: Callable[[int, int], None] | None = None) -> list[PackedLinear]:
    """The experts of a 3-D tensor (raw: its (experts * rows, row bytes) view of the file) as one packed
    (rows, cols) matrix each, in order. drop(start, stop) is told the byte range (from the tensor's start)
    of rows read for the last time, so the loader can let those file pages go."""
    experts, n, k = shape
    if raw.shape[0] != experts * n:
        raise ValueError(f"expert stack of shape {tuple(shape)} has {raw.shape[0]} rows, expected {experts * n}")
    row_bytes = raw.shape[1]
    read_ahead(raw)  # the whole stack's file pages read at once (packing.readahead)
    out = []
    for e in range(experts):
        first = e * n

        def done(r0: int, r1: int, first: int = first) -> None:
            if drop is not None:
                drop((first + r0) * row_bytes, (first + r1) * row_bytes)

        out.append(repack.from_blocks(raw[first:first + n], qtype, (n, k), fmt, keep_dense, done))
    return out


def storage_bytes(kernel: str, shape: tuple[int, ...]) -> int:
    """What the loader allocates for a stored tensor packed in `kernel` format: one matrix, or one per expert
    of a 3-D stack (each with its own scale padding)."""
    if len(shape) == 3:
        return shape[0] * repack.packed_storage_bytes(kernel, tuple(shape[1:]))
    return repack.packed_storage_bytes(kernel, shape)


def matrices(shape: tuple[int, ...]) -> int:
    """How many packed matrices a stored tensor becomes (experts of a stack, else one)."""
    return shape[0] if len(shape) == 3 else 1

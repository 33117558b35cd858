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

from kernels.formats import GROUP

from ..qlinear import LUT4_CLASSES, PackedLinear, tile_rows
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


def pack_gate_up(gate: torch.Tensor, up: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int, int],
                 fmt: str, keep_dense: bool, drop_gate: Callable[[int, int], None] | None = None,
                 drop_up: Callable[[int, int], None] | None = None) -> list[PackedLinear] | None:
    """Each expert's fused [gate | up] matrix from the two stacks (raw (experts * rows, row bytes) views of the
    file, both of `shape` and type `qtype`), its blocks written once straight into it, or None where the
    kernel format is not the file's blocks as they are (the lut4 family: MXFP4, IQ4_NL, IQ4_XS) or a dense
    copy is kept: those pack each stack (pack_stack) and the loader stacks the parts. Packing the parts first
    wrote every byte twice (gpt-oss-20b's gate and up are 2 x 24 x 32 experts of 4.4 MB) and faulted in
    both copies' pages; the result holds the same bytes as stacking them."""
    experts, n, k = shape
    kind = repack.kernel_format(qtype.name, fmt)
    cls = LUT4_CLASSES.get(kind)
    jit = keep_dense and not repack.dense_copy_forced() and repack.decodes_exactly(qtype.name, kind)
    if cls is None or fmt != "packed" or (keep_dense and not jit) or gate.shape != up.shape:
        return None
    if gate.shape[0] != experts * n or k % GROUP:
        raise ValueError(f"expert stacks of shape {tuple(shape)} have {gate.shape[0]} rows, expected {experts * n}")
    row_bytes, step = gate.shape[1], tile_rows(k)
    read_ahead(gate)
    read_ahead(up)
    out = []
    for e in range(experts):
        qs, first = torch.empty(2 * n, row_bytes, dtype=torch.uint8), e * n
        for half, (stack, drop) in enumerate(((gate, drop_gate), (up, drop_up))):
            for r0 in range(0, n, step):
                r1 = min(n, r0 + step)
                qs[half * n + r0:half * n + r1] = stack[first + r0:first + r1]
                if drop is not None:
                    drop((first + r0) * row_bytes, (first + r1) * row_bytes)
        matrix = cls(qs, None)
        matrix.jit_dense = jit
        out.append(matrix)
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

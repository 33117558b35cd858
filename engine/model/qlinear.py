"""One linear() for dense and packed weights, and the per-sequence rule that picks a packed matrix's path.

Packed matrices (engine.packed) are multiplied by torch's int4/int8 CPU kernels for generated tokens and
through dense fp32 tiles for prompt tokens: for many rows at once the kernels are slower than fp32 sgemm
(~1.7x at 256 rows, measured) and the matmul is compute bound anyway. Which path a row takes is decided
per sequence (prompt tokens vs generated ones, RowSplit), never by the size of the batch (a size rule
made 2 of 8 greedy chats differ alone vs batched, measured). Even so packed output is not bitwise
batch-invariant: fp32 sgemm results differ in the last bits with the row count, and the int4 kernel's
bf16 rounding of its inputs can amplify that; dense fp32 is the mode with that guarantee.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .packed import Packed, supported

__all__ = ["RowSplit", "linear", "q4_supported"]


def q4_supported() -> bool:
    """Whether this torch build has the CPU kernels packed weights need."""
    return supported()


class RowSplit:
    """Which rows of a step are prompt tokens (dense tiles) and which generated ones (packed kernels)."""

    def __init__(self, prompt_rows: torch.Tensor | None, T: int):
        n = 0 if prompt_rows is None else prompt_rows.numel()
        self.all_prompt = n == T > 0
        self.prompt = prompt_rows if 0 < n < T else None
        if self.prompt is not None:
            keep = torch.ones(T, dtype=torch.bool, device=prompt_rows.device)
            keep[prompt_rows] = False
            self.generated = keep.nonzero().reshape(-1)


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None, rows: RowSplit | None = None) -> torch.Tensor:
    """F.linear for dense or packed weights; for packed ones, `rows` sends prompt rows through dense tiles."""
    if not isinstance(w, Packed):
        return F.linear(x, w, bias)
    if rows is None or not (rows.all_prompt or rows.prompt is not None):
        y = w(x)
    elif rows.all_prompt:
        y = w.linear_tiled(x)
    else:
        y = x.new_empty(x.shape[0], w.shape[0])
        y.index_copy_(0, rows.prompt, w.linear_tiled(x.index_select(0, rows.prompt)))
        y.index_copy_(0, rows.generated, w(x.index_select(0, rows.generated)))
    return y if bias is None else y + bias

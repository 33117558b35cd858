"""A step's rows to their weights: prompt rows (RowSplit) through the exact dense weights where the model keeps
them, generated rows through the packed kernel; F.linear for dense weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .dense_weights import dense_product
from .packed_linear import PackedLinear, apply_act


class RowSplit:
    """Which rows of a step take dense weights (`prompt_rows`: prompt tokens) and which the packed kernel."""

    def __init__(self, prompt_rows: torch.Tensor | None, T: int):
        self.prompt_rows = prompt_rows
        n = 0 if prompt_rows is None else prompt_rows.numel()
        self.all_prompt = n == T > 0
        self.prompt = prompt_rows if 0 < n < T else None
        if self.prompt is not None:
            keep = torch.ones(T, dtype=torch.bool, device=prompt_rows.device)
            keep[prompt_rows] = False
            self.generated = keep.nonzero().reshape(-1)

    @classmethod
    def of_batch(cls, prompt_rows: torch.Tensor | None, cu_q: torch.Tensor) -> "RowSplit":
        """The step's prompt rows take dense weights (cu_q: (B+1,) offsets; its last is the row count)."""
        T = int(cu_q[-1])
        if prompt_rows is None or prompt_rows.numel() == 0:
            return cls(None, T)
        return cls(prompt_rows, T)

    @classmethod
    def of_rows(cls, prompt_rows: torch.Tensor | None, T: int, rows: torch.Tensor) -> "RowSplit":
        """The split of x[rows] (e.g. the logit rows) given the prompt rows of x."""
        if prompt_rows is None or prompt_rows.numel() == 0:
            return cls(None, rows.numel())
        is_prompt = torch.zeros(T, dtype=torch.bool, device=rows.device)
        is_prompt[prompt_rows] = True
        return cls(is_prompt[rows].nonzero().reshape(-1), rows.numel())


def linear(x: torch.Tensor, w: "torch.Tensor | PackedLinear", bias: torch.Tensor | None = None,
           rows: RowSplit | None = None, act: str | None = None) -> torch.Tensor:
    """F.linear for dense or packed weights (act="swiglu": silu(gate) * up of a [gate | up] weight); for
    packed weights, `rows` sends prompt rows through dense weights. A generated row takes the same path
    whatever else is in the step."""
    if not isinstance(w, PackedLinear):
        return apply_act(F.linear(x, w, bias), act)

    def packed(v: torch.Tensor) -> torch.Tensor:  # the kernel's epilogue only applies without a bias
        return w(v, act) if bias is None else apply_act(w(v) + bias, act)

    if rows is None or not (rows.all_prompt or rows.prompt is not None):
        return packed(x)
    if rows.all_prompt:
        return apply_act(dense_product(x, w, bias), act)
    y = x.new_empty(x.shape[0], w.shape[0] // 2 if act == "swiglu" else w.shape[0])
    y.index_copy_(0, rows.prompt, apply_act(dense_product(x.index_select(0, rows.prompt), w, bias), act))
    y.index_copy_(0, rows.generated, packed(x.index_select(0, rows.generated)))
    return y

"""Load-time fusion of packed matrices (q|k|v, gate|up): parts of one format stacked, parts of several kept
each in its own (PartsLinear) or converted to one (cat_packed's rule, the memory estimate's too)."""
from __future__ import annotations

import torch

from kernels import cpu_ext

from .affine import Q4Linear
from .packed_linear import PackedLinear, apply_act
from .q8 import Q8Linear
from .superblock import Q4KLinear


class PartsLinear(PackedLinear):
    """Row-stacked parts each kept in its own format (a Q4_K_M file's Q4_K q and k beside its Q6_K v, fused as
    q|k|v): each part multiplies with its own kernel and the outputs are joined. The group reads the file's
    own bytes; as one q8 matrix (the rule where prompt rows keep dense weights, cat_packed) it would read ~1.8x
    as many a token and need re-quantizing at load. `blocks` is every part's (qs, d, m) in order. A [gate | up]
    in parts applies SwiGLU as the fused kernel's epilogue does (apply_act: the same bits as the parts stacked
    into one matrix of their format)."""

    format = "parts"

    def __init__(self, parts: list[PackedLinear]):
        if len({p.shape[1] for p in parts}) != 1 or any(p.prompt_dense for p in parts):
            raise ValueError("PartsLinear parts must share K and keep no dense prompt rows")
        self.parts = list(parts)
        super().__init__((sum(p.shape[0] for p in parts), parts[0].shape[1]), None)

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        out, row = [], 0
        for p in self.parts:
            lo, hi = max(start, row), min(stop, row + p.shape[0])
            if lo < hi:
                out.append(p.dense_rows(lo - row, hi - row))
            row += p.shape[0]
        return torch.cat(out)

    @property
    def blocks(self) -> tuple:
        return tuple(t for p in self.parts for t in p.blocks)

    @property
    def kernel_ids(self) -> list[int]:
        return [i for p in self.parts for i in p.kernel_ids]

    def __call__(self, x: torch.Tensor, act: str | None = None) -> torch.Tensor:
        return apply_act(torch.cat([p(x) for p in self.parts], dim=-1), act)


def cat_packed(parts: list[PackedLinear], consume: bool = False) -> PackedLinear:
    """Stack packed weights along the output dim: one format as is; mixed formats (a Q4_K_M file's Q4_K q/k
    beside a Q6_K v) stay each in its own (PartsLinear) where the kernels run and no part keeps dense prompt
    rows, else all become q4 (Q4_K beside Q4_0/Q4_1) or q8, each part re-quantized from its exact weights
    (engine.model.packing.repack.kernel_formats, the estimate's rule). `consume`: the parts are given up and emptied
    while they are copied (loading; see stack_parts)."""
    kinds = {type(p) for p in parts}
    if len(kinds) > 1 and cpu_ext.ops() is not None and not any(p.prompt_dense for p in parts):
        return PartsLinear(parts)
    if any(p.prompt_dense for p in parts) and (len(kinds) > 1 or len({p.jit_dense for p in parts}) > 1):
        for p in parts:  # a converted part no longer decodes to its exact weights: the group keeps its copy
            if p.jit_dense:
                p.dense, p.jit_dense = p.dequantize(), False
    if len(kinds) == 1:
        return kinds.pop().cat(parts, consume)
    if kinds == {Q4Linear, Q4KLinear} and cpu_ext.ops() is not None:  # Q4_K beside Q4_0/Q4_1: all q4, as before q4k
        return Q4Linear.cat([p if isinstance(p, Q4Linear) else p.to_q4() for p in parts], consume)
    as_q8 = [p if isinstance(p, Q8Linear) else Q8Linear.requantize(p) for p in parts]
    return Q8Linear.cat(as_q8, consume)  # a kept dense copy stays each part's exact weights

"""A sparse layer's experts in one call of pagedeck's CPU kernel (kernels/cpu/moe.cpp) instead of one matmul
per expert from Python.

The kernel takes the layer's packed experts as they are (each in its own format: a Q4_K_M file's Q4_K gate|up
beside its Q4_K or Q6_K down, q4, q5, q8 ...), the rows, and the router's choices and weights, and does
[gate | up] -> SwiGLU -> down -> the weighted sum of each row's experts with its threads splitting (expert,
chunk of rows) tasks of about equal bytes: each expert that any row chose is read once a step. Its bits are
the torch path's (engine.model.moe.MoEBlock.__call__, which stays the fallback and the oracle), so a row's
output never depends on the rest of the batch either way.

The kernel runs where the CPU kernels are loaded, the rows are fp32 on the CPU, every expert's matrices are
one-part packed matrices, the activation is the plain SwiGLU without biases, and no row of the step takes
the exact dense weights (prompt rows of a model that keeps them: engine.model.qlinear.RowSplit). The layer's
experts go into the kernel's MoEExperts once, on the block's first call, and stay there with the block.
"""
from __future__ import annotations

import contextlib
import weakref

import torch

from kernels import cpu_ext
from kernels.packed import ACTIVATIONS

from .qlinear import PackedLinear, PartsLinear, RowSplit

_tables: dict[int, object] = {}  # id(block) -> its MoEExperts, or None where its experts don't fit the kernel
_enabled = True  # torch_path() turns the kernel off (benchmarks and tests compare both paths in one process)


def runs(block, h: torch.Tensor, rows: RowSplit | None) -> bool:
    """Whether experts() computes this call of `block` (an engine.model.moe.MoEBlock) for rows h."""
    if not _enabled or h.device.type != "cpu" or h.dtype != torch.float32 or cpu_ext.ops() is None:
        return False
    if rows is not None and rows.prompt_rows is not None and rows.prompt_rows.numel():
        return False
    if any(getattr(block, name, None) is not None for name in ("swiglu_limit", "gate_up_bias", "down_bias")):
        return False
    return table(block) is not None


def experts(block, h: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The block's output for rows h (T, hidden) given the router's (T, k) weights and chosen experts."""
    return cpu_ext.ops().moe_experts(h.contiguous(), chosen.contiguous(), weights.contiguous(), table(block),
                                     ACTIVATIONS["swiglu"])


@contextlib.contextmanager
def torch_path():
    """Inside the block every MoE layer takes the torch path (engine.model.moe), the kernel's oracle."""
    global _enabled
    _enabled = False
    try:
        yield
    finally:
        _enabled = True


def table(block):
    """The block's experts as the kernel's MoEExperts (built on first use), or None where some expert is not a
    one-part packed matrix."""
    key = id(block)
    if key not in _tables:
        _tables[key] = _build(block)
        weakref.finalize(block, _tables.pop, key, None)
    return _tables[key]


def _build(block):
    mats = list(zip(block.gate_up, block.down))
    if not all(isinstance(w, PackedLinear) and not isinstance(w, PartsLinear) for pair in mats for w in pair):
        return None
    blocks, ids = [], []
    for pair in mats:
        for w in pair:
            qs, d, m = w.blocks
            blocks += [qs, d, m if m is not None else d.new_empty(0)]
            ids.append(w.kernel_id)
    return torch.classes.pagedeck.MoEExperts(blocks, ids)

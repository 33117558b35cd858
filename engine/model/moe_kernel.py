"""A sparse layer's experts in one call of pagedeck's CPU kernel (kernels/cpu/moe.cpp) instead of one matmul
per expert from Python.

The kernel takes the layer's packed experts as they are (each in its own format: a Q4_K_M file's Q4_K gate|up
beside its Q4_K or Q6_K down, q4, q5, q8, gpt-oss's MXFP4, IQ4_NL/IQ4_XS ...), the rows, and the router's
choices and weights, and does [gate | up] -> activation -> down -> the weighted sum of each row's experts with
its threads splitting (expert, chunk of rows) tasks of about equal bytes: each expert that any row chose is read
once a step. The activation is the plain SwiGLU without biases, or gpt-oss's clamped SwiGLU with its biases
added to gate|up's and down's outputs where the torch path adds them. Its bits are the torch path's
(engine.model.moe.MoEBlock.__call__, which stays the fallback and the oracle), so a row's output never depends
on the rest of the batch either way.

The kernel runs where the CPU kernels are loaded, the rows are fp32 on the CPU, every expert's matrices are
one-part packed matrices, and no row of the step takes the exact dense weights (prompt rows of a model that
keeps them: engine.model.qlinear.RowSplit). The layer's experts go into the kernel's MoEExperts once, on the
block's first call, and stay in the block (its `kernel_table` field).
"""
from __future__ import annotations

import contextlib

import torch

from kernels import cpu_ext
from kernels.packed import ACTIVATIONS

from .qlinear import PackedLinear, PartsLinear, RowSplit

CLAMPED_SWIGLU = 2  # moe.cpp's activation id of gpt-oss's clamped SwiGLU (kernels.packed.ACTIVATIONS' are 0, 1)
UNBUILT = object()  # a block's kernel_table before its first call
_enabled = True  # torch_path() turns the kernel off (benchmarks and tests compare both paths in one process)


def runs(block, h: torch.Tensor, rows: RowSplit | None) -> bool:
    """Whether experts() computes this call of `block` (an engine.model.moe.MoEBlock) for rows h."""
    if not _enabled or h.device.type != "cpu" or h.dtype != torch.float32 or cpu_ext.ops() is None:
        return False
    if rows is not None and rows.prompt_rows is not None and rows.prompt_rows.numel():
        return False
    if block.swiglu_limit is None and (block.gate_up_bias is not None or block.down_bias is not None):
        return False  # biases before the plain SwiGLU: the torch path's activation is not the kernel's
    return table(block) is not None


def experts(block, h: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The block's output for rows h (T, hidden) given the router's (T, k) weights and chosen experts."""
    act = ACTIVATIONS["swiglu"] if block.swiglu_limit is None else CLAMPED_SWIGLU
    return cpu_ext.ops().moe_experts(h.contiguous(), chosen.contiguous(), weights.contiguous(), table(block), act)


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
    """The block's experts as the kernel's MoEExperts (built on first use and kept in block.kernel_table), or
    None where some expert is not a one-part packed matrix."""
    if block.kernel_table is UNBUILT:
        block.kernel_table = _build(block)
    return block.kernel_table


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
    biases = []
    if block.gate_up_bias is not None or block.down_bias is not None:
        if block.gate_up_bias is None or block.down_bias is None:
            return None  # a bias on one side only: no model has one, the torch path serves it
        for gu, dn in zip(block.gate_up_bias, block.down_bias):
            if gu.dtype != torch.float32 or dn.dtype != torch.float32:
                return None  # the torch path adds them in their own dtype
            biases += [gu.contiguous(), dn.contiguous()]
    limit = float("inf") if block.swiglu_limit is None else block.swiglu_limit
    return torch.classes.pagedeck.MoEExperts(blocks, ids, biases, limit, block.swiglu_alpha)

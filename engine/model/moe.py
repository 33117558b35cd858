"""Mixture-of-experts feed-forward blocks (Qwen3-MoE, Mixtral): the router, the experts, their tensors.

A sparse layer's MLP is a router, a (num_experts, hidden) matrix, and num_experts gated MLPs (SwiGLU, each
its own [gate | up] and down, moe_intermediate_size wide). Each token's router logits go through a softmax
over all experts; the token runs its top-k experts and sums their outputs weighted by those probabilities,
renormalised to sum to 1 where the config says so (Qwen3-MoE's norm_topk_prob; Mixtral always, which is the
same as its softmax over the top-k logits).

In a batched step the (row, k) choices are flattened and sorted by expert (a stable argsort), so each expert
that any row chose runs one matmul over exactly its rows, through qlinear.linear (dense or packed weights
alike); the weighted outputs are scattered back with index_add_. A row's experts depend on its own router
logits only, and its output is the sum of its experts' rows added in expert order: neither depends on what
else is in the batch. Experts are kept as one matrix per expert (not a 3-D stack) so a packed format
applies to each as to any other projection: a GGUF's expert stacks are packed expert by expert in the file's
own formats (engine.model.packing.experts), gate and up of one expert fused into one [gate | up] matrix as
the dense layers have them. With packed experts a prompt row takes the exact dense weights where the model
keeps them (qlinear.RowSplit, per expert over just its rows), as every other projection does; which path a
row takes depends on the row alone.

A decode step reads the router and, per token, its top-k experts: decode_bytes counts k of the E experts
(their mean size), not all of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from . import moe_kernel
from .qlinear import PackedLinear, RowSplit, linear

if TYPE_CHECKING:
    from .config import ModelConfig

# HF tensor names under a layer's prefix: the MLP module, router, and per-expert (gate, up, down) names
_HF_NAMES = {
    "qwen3moe": ("mlp.", "gate.weight", ("gate_proj.weight", "up_proj.weight", "down_proj.weight")),
    "mixtral": ("block_sparse_moe.", "gate.weight", ("w1.weight", "w3.weight", "w2.weight")),
}

# llama.cpp's 3-D expert tensors (experts, rows, cols): which of (gate, up, down) each one stacks
_GGUF_STACKS = {"ffn_gate_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}


@dataclass
class MoEBlock:
    """One sparse layer's MLP: a dense router and per-expert [gate | up] and down weights."""
    router: torch.Tensor  # (num_experts, hidden), always dense: routing is where rounding would flip choices
    gate_up: list  # per expert: (2 * moe_intermediate, hidden), a tensor or a PackedLinear
    down: list  # per expert: (hidden, moe_intermediate)
    top_k: int
    norm_topk: bool
    observe: Callable[[torch.Tensor], None] | None = None  # sees each route's experts (engine.generator.expert_stats)

    def weights(self) -> list:
        return [self.router, *self.gate_up, *self.down]

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights (T, k) in h's dtype, experts (T, k)) of each row: softmax over all experts in fp32, top-k,
        renormalised where norm_topk."""
        probs = torch.softmax(F.linear(h, self.router), dim=-1, dtype=torch.float32)
        top, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            top = top / top.sum(dim=-1, keepdim=True)
        if self.observe is not None:
            self.observe(experts)
        return top.to(h.dtype), experts

    def decode_bytes(self) -> int:
        """Weight bytes one token's step reads: the router and top_k experts' [gate | up] and down (the mean
        expert's size: which k it picks depends on the token)."""
        experts = sum(_nbytes(w) for w in self.gate_up + self.down)
        return _nbytes(self.router) + experts * self.top_k // len(self.gate_up)

    def __call__(self, h: torch.Tensor, rows: RowSplit | None = None) -> torch.Tensor:
        """The block's output for rows h (T, hidden); `rows` (packed experts): which rows are prompt rows."""
        weights, experts = self.route(h)
        if moe_kernel.runs(self, h, rows):  # all experts in one call of the CPU kernel: this path's bits
            return moe_kernel.experts(self, h, weights, experts)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # choices grouped by expert, rows ascending within each
        order_rows = order // self.top_k
        T = h.shape[0]
        prompt = None if rows is None else rows.prompt_rows
        scale = weights.reshape(-1).index_select(0, order).unsqueeze(1)
        counts = torch.bincount(flat, minlength=len(self.gate_up)).tolist()
        out = torch.zeros_like(h)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            sel = order_rows[start:start + n]
            split = None if prompt is None else RowSplit.of_rows(prompt, T, sel)
            a = linear(h.index_select(0, sel), self.gate_up[e], rows=split, act="swiglu")
            out.index_add_(0, sel, linear(a, self.down[e], rows=split) * scale[start:start + n])
            start += n
        return out


def _nbytes(w) -> int:
    """Bytes a decode-sized call reads of a weight: a packed matrix's blocks, a dense tensor's values."""
    return w.nbytes() if isinstance(w, PackedLinear) else w.numel() * w.element_size()


def tensor_names(config: "ModelConfig", prefix: str) -> list[str]:
    """The HF tensor names of a sparse layer's MLP (prefix: "model.layers.{i}.")."""
    module, router, (gate, up, down) = _HF_NAMES[config.arch]
    p = prefix + module
    return [p + router] + [p + f"experts.{e}.{n}" for e in range(config.num_experts) for n in (gate, up, down)]


def tensor_shape(config: "ModelConfig", name: str) -> tuple[int, int] | None:
    """The shape of an MoE tensor name (None for any other name)."""
    if config.arch not in _HF_NAMES:
        return None
    module, router, (gate, up, down) = _HF_NAMES[config.arch]
    h, i = config.hidden_size, config.moe_intermediate_size
    if f".{module}experts." in name:
        return (h, i) if name.endswith(down) else (i, h)
    if name.endswith(module + router):
        return (config.num_experts, h)
    return None


def build(config: "ModelConfig", prefix: str, get: Callable[[str], object],
          fuse: Callable[[list[str], str], object]) -> MoEBlock:
    """A sparse layer's block from the loader's `get` (one tensor) and `fuse` (parts into one matrix,
    dropping the parts) over an HF-named state dict."""
    module, router, (gate, up, down) = _HF_NAMES[config.arch]
    p = prefix + module
    e_names = [p + f"experts.{e}." for e in range(config.num_experts)]
    router_w = get(p + router)
    if not isinstance(router_w, torch.Tensor):
        raise NotImplementedError(f"{p + router}: a packed (quantized) MoE router is not supported; "
                                  "load the model with weights='dense'")
    return MoEBlock(router=router_w,
                    gate_up=[fuse([e + gate, e + up], e + "gate_up_proj.weight") for e in e_names],
                    down=[get(e + down) for e in e_names],
                    top_k=config.experts_per_token, norm_topk=config.norm_topk_prob)


def gguf_expert_names(gguf_name: str, config: "ModelConfig") -> list[str] | None:
    """The HF names, expert by expert, of the matrices a llama.cpp 3-D expert tensor stacks
    (blk.{i}.ffn_{gate,up,down}_exps.weight); None for any other tensor name."""
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _GGUF_STACKS or config.arch not in _HF_NAMES:
        return None
    module, _, names = _HF_NAMES[config.arch]
    name = names[_GGUF_STACKS[parts[2]]]
    return [f"model.layers.{parts[1]}.{module}experts.{e}.{name}" for e in range(config.num_experts)]

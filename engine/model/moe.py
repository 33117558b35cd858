"""Mixture-of-experts feed-forward blocks (Qwen3-MoE, Mixtral, gpt-oss): the router, the experts, their tensors.

A sparse layer's MLP is a router, a (num_experts, hidden) matrix, and num_experts gated MLPs (SwiGLU, each
its own [gate | up] and down, moe_intermediate_size wide). Each token's router logits go through a softmax
over all experts; the token runs its top-k experts and sums their outputs weighted by those probabilities,
renormalised to sum to 1 where the config says so (Qwen3-MoE's norm_topk_prob; Mixtral always, which is the
same as its softmax over the top-k logits). gpt-oss differs in three options: biases (router, each expert's
gate|up and down), weights a softmax over the top-k router logits, and a clamped SwiGLU (gate <= limit,
-limit <= up <= limit, (up + 1) * gate * sigmoid(alpha * gate)). Its checkpoint stacks the experts
(experts.gate_up_proj (E, hidden, 2I) with gate and up interleaved column by column, experts.down_proj
(E, I, hidden)); hf_experts splits them into one [gate | up] and one down matrix per expert on load.

In a batched step the (row, k) choices are flattened and sorted by expert (a stable argsort), so each expert that
any row chose runs one matmul over exactly its rows, through qlinear.linear (dense or packed weights alike); the
weighted outputs are scattered back with index_add_. A row's experts depend on its own router logits only (on a CPU
each summed in one fixed order, kernels.router_logits), and its output is the sum of its experts' rows added in
expert order: neither depends on what else is in the batch. Experts are kept as one matrix per expert (not a 3-D
stack) so a packed format applies to each as to any other projection: a GGUF's expert stacks are packed expert by
expert in the file's own formats (engine.model.packing.experts), gate and up of one expert fused into one
[gate | up] matrix as the dense layers have them. With packed experts a prompt row takes the exact dense weights
where the model keeps them (qlinear.RowSplit, per expert over just its rows), as every other projection does; which
path a row takes depends on the row alone.

A decode step reads the router and, per token, its top-k experts: decode_bytes counts k of the E experts
(their mean size), not all of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

import kernels
from kernels import cpu_ext

from . import moe_kernel
from .qlinear import PackedLinear, RowSplit, linear

if TYPE_CHECKING:
    from .config import ModelConfig

# HF tensor names under a layer's prefix: the MLP module, router, and per-expert (gate, up, down) names
_HF_NAMES = {
    "qwen3moe": ("mlp.", "gate.weight", ("gate_proj.weight", "up_proj.weight", "down_proj.weight")),
    "mixtral": ("block_sparse_moe.", "gate.weight", ("w1.weight", "w3.weight", "w2.weight")),
    # the per-expert names hf_experts splits gpt-oss's stacks into (biases: the same with .bias)
    "gpt-oss": ("mlp.", "router.weight", ("gate_proj.weight", "up_proj.weight", "down_proj.weight")),
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
    router_bias: torch.Tensor | None = None  # (num_experts,)
    gate_up_bias: list | None = None  # per expert: (2 * moe_intermediate,), [gate | up]
    down_bias: list | None = None  # per expert: (hidden,)
    # or "topk_softmax": a softmax over the top-k logits (gpt-oss, llama.cpp's SOFTMAX_WEIGHT), the same
    # weights as a renormalised softmax_topk up to rounding
    routing: str = "softmax_topk"
    swiglu_limit: float | None = None  # the clamped SwiGLU (gpt-oss) where set
    swiglu_alpha: float = 1.0
    # the experts as the CPU kernel's MoEExperts (engine.model.moe_kernel builds it on the first call; None
    # where they don't fit the kernel)
    kernel_table: object = field(default=moe_kernel.UNBUILT, repr=False, compare=False)

    def weights(self) -> list:
        biases = [self.router_bias, *(self.gate_up_bias or ()), *(self.down_bias or ())]
        return [self.router, *self.gate_up, *self.down] + [b for b in biases if b is not None]

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights (T, k) in h's dtype, experts (T, k)) of each row: softmax over all experts in fp32, top-k,
        renormalised where norm_topk; or (topk_softmax) the top-k logits, then a softmax over those k."""
        logits = kernels.router_logits(h, self.router, self.router_bias)
        if self.routing == "topk_softmax":
            top, experts = torch.topk(logits, self.top_k, dim=-1)
            top = torch.softmax(top, dim=-1, dtype=torch.float32)
        else:
            top, experts = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), self.top_k, dim=-1)
            if self.norm_topk:
                top = top / top.sum(dim=-1, keepdim=True)
        if self.observe is not None:
            self.observe(experts)
        return top.to(h.dtype), experts

    def decode_bytes(self) -> int:
        """Weight bytes one token's step reads: the router and top_k experts' [gate | up] and down (the mean
        expert's size: which k it picks depends on the token)."""
        experts = sum(_nbytes(w) for w in self.gate_up + self.down + (self.gate_up_bias or []) + (self.down_bias or []))
        router = _nbytes(self.router) + (0 if self.router_bias is None else _nbytes(self.router_bias))
        return router + experts * self.top_k // len(self.gate_up)

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
            a = self._gated(h.index_select(0, sel), e, split)
            down_bias = None if self.down_bias is None else self.down_bias[e]
            out.index_add_(0, sel, linear(a, self.down[e], down_bias, rows=split) * scale[start:start + n])
            start += n
        return out

    def _gated(self, x: torch.Tensor, e: int, split: RowSplit | None) -> torch.Tensor:
        """Expert e's activation of rows x: SwiGLU (the kernels' fused epilogue), or gpt-oss's clamped form."""
        bias = None if self.gate_up_bias is None else self.gate_up_bias[e]
        if self.swiglu_limit is None:
            return linear(x, self.gate_up[e], bias, rows=split, act="swiglu")
        return clamped_swiglu(linear(x, self.gate_up[e], bias, rows=split), self.swiglu_limit, self.swiglu_alpha)


def clamped_swiglu(gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    """gpt-oss's SwiGLU of [gate | up] rows: gate clamped above at limit, up to [-limit, limit], then
    (up + 1) * gate * sigmoid(alpha * gate). fp32 rows on the CPU take the C++ kernels' function (the MoE
    kernel's epilogue: both paths then give the same bits); others these torch operations."""
    ops = cpu_ext.ops()
    if ops is not None and gate_up.device.type == "cpu" and gate_up.dtype == torch.float32 and gate_up.dim() == 2:
        return ops.clamped_swiglu(gate_up.contiguous(), limit, alpha)
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def _nbytes(w) -> int:
    """Bytes a decode-sized call reads of a weight: a packed matrix's blocks, a dense tensor's values."""
    return w.nbytes() if isinstance(w, PackedLinear) else w.numel() * w.element_size()


def tensor_names(config: "ModelConfig", prefix: str) -> list[str]:
    """The HF tensor names of a sparse layer's MLP (prefix: "model.layers.{i}.")."""
    module, router, (gate, up, down) = _HF_NAMES[config.arch]
    p = prefix + module
    names = [p + router] + [p + f"experts.{e}.{n}" for e in range(config.num_experts) for n in (gate, up, down)]
    if config.router_bias:
        names.append(p + _bias(router))
    if config.expert_bias:
        names += [p + f"experts.{e}.{_bias(n)}" for e in range(config.num_experts) for n in (gate, up, down)]
    return names


def _bias(weight_name: str) -> str:
    return weight_name.removesuffix(".weight") + ".bias"


def tensor_shape(config: "ModelConfig", name: str) -> tuple[int, int] | None:
    """The shape of an MoE tensor name (None for any other name)."""
    if config.arch not in _HF_NAMES:
        return None
    module, router, (gate, up, down) = _HF_NAMES[config.arch]
    h, i = config.hidden_size, config.moe_intermediate_size
    if f".{module}experts." in name:
        if name.endswith(".bias"):
            return (h,) if name.endswith(_bias(down)) else (i,)
        if name.endswith(".gate_up_proj.weight"):  # an expert's [gate | up], fused as the file was read
            return (2 * i, h)
        return (h, i) if name.endswith(down) else (i, h)
    if name.endswith(module + router):
        return (config.num_experts, h)
    if name.endswith(module + _bias(router)):
        return (config.num_experts,)
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
    biased = config.expert_bias

    def gate_up_bias(e: str) -> torch.Tensor:
        return torch.cat([get(e + _bias(gate)), get(e + _bias(up))])

    return MoEBlock(router=router_w,
                    gate_up=[fuse([e + gate, e + up], e + "gate_up_proj.weight") for e in e_names],
                    down=[get(e + down) for e in e_names],
                    top_k=config.experts_per_token, norm_topk=config.norm_topk_prob,
                    router_bias=get(p + _bias(router)) if config.router_bias else None,
                    gate_up_bias=[gate_up_bias(e) for e in e_names] if biased else None,
                    down_bias=[get(e + _bias(down)) for e in e_names] if biased else None,
                    routing=config.moe_routing, swiglu_limit=config.swiglu_limit, swiglu_alpha=config.swiglu_alpha)


def gguf_expert_names(gguf_name: str, config: "ModelConfig") -> list[str] | None:
    """The HF names, expert by expert, of the matrices a llama.cpp 3-D expert tensor stacks
    (blk.{i}.ffn_{gate,up,down}_exps.weight), or of the rows of its 2-D bias stack (.bias, gpt-oss); None
    for any other tensor name."""
    parts = gguf_name.split(".")
    if (len(parts) != 4 or parts[0] != "blk" or parts[2] not in _GGUF_STACKS or config.arch not in _HF_NAMES
            or parts[3] not in ("weight", "bias")):
        return None
    module, _, names = _HF_NAMES[config.arch]
    name = names[_GGUF_STACKS[parts[2]]]
    name = _bias(name) if parts[3] == "bias" else name
    return [f"model.layers.{parts[1]}.{module}experts.{e}.{name}" for e in range(config.num_experts)]


def gguf_gate_up_pairs(gguf_names: list[str], config: "ModelConfig") -> dict[str, str]:
    """{blk.{i}.ffn_gate_exps.weight: blk.{i}.ffn_up_exps.weight} for each layer holding both stacks, whose
    experts' gate and up the model fuses into one [gate | up] matrix each."""
    names = set(gguf_names)
    return {n: n.replace("ffn_gate_exps", "ffn_up_exps") for n in gguf_names
            if n.startswith("blk.") and n.endswith(".ffn_gate_exps.weight")
            and n.replace("ffn_gate_exps", "ffn_up_exps") in names and gguf_expert_names(n, config)}


def gguf_gate_up_names(gguf_name: str, config: "ModelConfig") -> list[str]:
    """The HF names, expert by expert, of the fused [gate | up] matrices (what build() takes for
    experts.{e}.gate_up_proj.weight) of the layer a gate or up expert stack belongs to."""
    names = gguf_expert_names(gguf_name, config)
    if not names:
        raise ValueError(f"{gguf_name} is no expert stack of a {config.arch} model")
    return [n.rsplit(".", 2)[0] + ".gate_up_proj.weight" for n in names]


def router_name(config: "ModelConfig") -> str:
    """The MLP-relative HF name of the router (llama.cpp's ffn_gate_inp), without .weight or .bias."""
    module, router, _ = _HF_NAMES[config.arch]
    return module + router.removesuffix(".weight")


def hf_experts(config: "ModelConfig", name: str, read: Callable[[], torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """gpt-oss's stacked expert tensors (read() reads the stored one) as the per-expert tensors the model is
    built from: gate_up_proj (E, hidden, 2I), gate and up interleaved column by column, becomes each
    expert's gate_proj and up_proj (I, hidden); down_proj (E, I, hidden) each expert's down_proj
    (hidden, I); the biases likewise. None for any other tensor (or architecture)."""
    if config.arch != "gpt-oss" or ".mlp.experts." not in name:
        return None
    p, _, stored = name.rpartition(".")
    if stored.endswith(("_blocks", "_scales")):
        raise ValueError(f"{name}: gpt-oss experts stored as MXFP4 blocks in a safetensors folder are "
                                  "not supported; load the model's GGUF file, or a folder saved dequantized")
    if stored not in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
        return None
    t = read()
    experts = range(t.shape[0])
    if stored == "gate_up_proj":
        return {f"{p}.{e}.{n}.weight": part for e in experts
                for n, part in (("gate_proj", t[e, :, 0::2].T.contiguous()), ("up_proj", t[e, :, 1::2].T.contiguous()))}
    if stored == "gate_up_proj_bias":
        return {f"{p}.{e}.{n}.bias": part for e in experts
                for n, part in (("gate_proj", t[e, 0::2].contiguous()), ("up_proj", t[e, 1::2].contiguous()))}
    if stored == "down_proj":
        return {f"{p}.{e}.down_proj.weight": t[e].T.contiguous() for e in experts}
    return {f"{p}.{e}.down_proj.bias": t[e].clone() for e in experts}

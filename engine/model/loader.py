"""Building a model's weights: reading the checkpoint, fusing q|k|v and gate|up, packing, the output head.

Model (engine.model.model) is config + layers + forward; everything that turns a checkpoint into its
tensors is here, decided once: the weight format, which matrices stay packed, which head the model uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import kernels
from kernels.packed import q4_supported

from ..contract import WEIGHT_ALIASES, WEIGHT_FORMATS, is_gguf
from .config import ModelConfig
from .embedding import GGMLRows
from .catalog.memory import check_fits
from .moe import MoEBlock, build as build_moe
from .qlinear import AffineLinear, PackedLinear, PartsLinear, Q8Linear, cat_packed
from .heap import loading_heap, release_freed_memory
from .weights import default_model_path, load_checkpoint


@dataclass
class Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: torch.Tensor
    attn_out_norm: torch.Tensor | None  # sandwich norm on the attention output (Gemma 2/3)
    post_norm: torch.Tensor  # the MLP's input norm
    gate_up: torch.Tensor | None  # None in a sparse layer: its MLP is `moe`
    down: torch.Tensor | None
    mlp_out_norm: torch.Tensor | None  # sandwich norm on the MLP output
    window: int | None = None  # sliding window of this layer's attention
    sliding_rope: bool = False  # rotate with the sliding layers' own rope base (Gemma 3)
    moe: MoEBlock | None = None  # a mixture-of-experts MLP (engine.model.moe) in place of gate_up and down
    o_bias: torch.Tensor | None = None  # the attention output projection's bias (gpt-oss)
    sinks: torch.Tensor | None = None  # (num_heads,) attention sink logits (gpt-oss)

    def weights(self, experts: bool = True) -> list:
        """Every weight of the layer (tensors or packed matrices), for counting parameters and bytes; without
        its mixture of experts' (router and experts) where not `experts`."""
        own = [t for name, t in vars(self).items() if name not in ("window", "sliding_rope", "moe") and t is not None]
        return own + (self.moe.weights() if self.moe is not None and experts else [])


@dataclass
class ModelWeights:
    """What a Model computes with, as the loader built it."""
    embed: torch.Tensor | PackedLinear | GGMLRows  # GGMLRows: an untied GGUF table beside packed layers
    lm_head: torch.Tensor | PackedLinear  # the embedding itself where tied
    norm: torch.Tensor
    layers: list[Layer]
    weight_format: str  # "dense", or the packed format asked for ("packed", "q8") where a matrix is packed


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32  # bf16 matmul is very slow on CPUs without AMX


@dataclass(frozen=True)
class LoadPlan:
    """Where a checkpoint loads to, resolved from Model.load's arguments."""
    path: Path
    device: torch.device
    dtype: torch.dtype
    fmt: str  # "dense", "packed" or "q8" ("auto" and the older names resolved)


def plan_load(path: str | Path | None, device: str | torch.device | None, dtype: torch.dtype | None,
              weights: str, check_memory: bool) -> LoadPlan:
    """Resolve the defaults and the weight format; refuse what can't run (and, with check_memory, what will
    not fit: engine.ModelTooLarge) before reading any weights."""
    weights = WEIGHT_ALIASES.get(weights, weights)
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
    resolved = Path(path) if path is not None else default_model_path()
    dev = torch.device(device) if device is not None else default_device()
    dt = dtype if dtype is not None else default_dtype(dev)
    if weights == "auto":  # the fast path where it exists: quantized GGUF weights on a CPU
        weights = "packed" if dev.type == "cpu" and is_gguf(resolved) and q4_supported() else "dense"
    if check_memory and resolved.exists():
        check_fits(resolved, cache_tokens=0, weights=weights, device=dev.type, dtype=str(dt).removeprefix("torch."))
    if weights in ("packed", "q8") and (dev.type != "cpu" or dt != torch.float32):
        raise ValueError(f"weights={weights!r} runs on the CPU in float32 only (CPU kernels)")
    return LoadPlan(resolved, dev, dt, weights)


def load(plan: LoadPlan, progress: Callable[[float], None] | None = None,
         moving: Callable[[], None] | None = None) -> tuple[ModelConfig, ModelWeights, tuple | None]:
    """Read the checkpoint and build its weights (progress(1.0) once they are built; moving(): see
    engine.model.weights.load_checkpoint); the weights' large blocks get mappings of their own
    (heap.loading_heap), so that freeing the model gives them back whole.

    Returns (config, weights, None), or, where a GGUF lets the model start on its mapped file (engine.model.
    settle), (config, the weights as views of the file, (the settled weights, the load's Unmoved)): the settled
    ones are built around tensors that only its moves fill."""
    with loading_heap():
        config, state, unmoved = load_checkpoint(plan.path, dtype=plan.dtype, device="cpu", progress=progress,
                                                 fmt=plan.fmt, moving=moving, start_mapped=plan.device.type == "cpu")
        built = build(config, state, plan.device, plan.dtype, plan.fmt, moved=unmoved is None)
        del state
        first = None
        if unmoved is not None:
            first = build(config, unmoved.mapped, plan.device, plan.dtype, plan.fmt, keep_parts=True)
            unmoved.mapped = {}
    release_freed_memory()
    if progress is not None:
        progress(1.0)
    if first is None:
        return config, built, None
    return config, first, (built, unmoved)


def build(config: ModelConfig, w: dict, device: torch.device, dtype: torch.dtype, fmt: str = "dense",
          keep_parts: bool = False, moved: bool = True) -> ModelWeights:
    """The weights of an HF-named state dict (tensors, or PackedLinear matrices kept packed in format `fmt`);
    the q/k/v and gate/up entries are removed from `w` once fused (they would otherwise be held twice while
    loading). `keep_parts`: packed q|k|v and gate|up stay their parts, never copied (PartsLinear: a model started
    on its mapped file, engine.model.settle). `moved=False`: the state's bytes are still to be moved in (the
    settled weights of such a model), so nothing is read: the head is grouped when it is adopted (group_head)."""
    c = config

    def get(name: str) -> torch.Tensor:
        if name not in w:
            raise ValueError(f"weights are missing tensor {name!r}")
        if isinstance(w[name], (PackedLinear, GGMLRows)):
            if device.type != "cpu":
                raise ValueError(f"packed weights ({type(w[name]).__name__}) run on the CPU only (CPU kernels); "
                                 "load with weights='dense' on a GPU")
            return w[name]
        return w[name].to(device=device, dtype=dtype)

    def fused(names: list[str], stored_fused: str):
        # stored fused, or fused while reading (engine.model.packing.fused_on_read)
        if c.fused_projections or stored_fused in w:
            return get(stored_fused)
        parts = [get(n) for n in names]
        for n in names:  # the parts become the fused copy: drop them so loading never holds a model twice
            w.pop(n)
        if keep_parts and all(isinstance(p, PackedLinear) for p in parts):
            return PartsLinear(parts)
        if all(isinstance(p, PackedLinear) for p in parts):
            out = cat_packed(parts, consume=True)
        else:
            out = torch.cat([p.dequantize(dtype) if isinstance(p, PackedLinear) else p for p in parts])
        parts.clear()
        release_freed_memory()  # give their pages back before the next layer's fusion allocates
        return out

    embed = get("model.embed_tokens.weight")
    head = embed if c.tie_word_embeddings or "lm_head.weight" not in w else get("lm_head.weight")
    norm = get("model.norm.weight")
    layers: list[Layer] = []
    sandwich = c.sandwich_norm
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        bias = None
        if c.attention_bias:
            bias = get(a + "qkv_proj.bias") if c.fused_projections else torch.cat(
                [get(a + f"{n}_proj.bias") for n in "qkv"])
        sparse = build_moe(c, p, get, fused) if c.layer_is_sparse(i) else None
        layers.append(Layer(
            input_norm=get(p + "input_layernorm.weight"),
            qkv=fused([a + f"{n}_proj.weight" for n in "qkv"], a + "qkv_proj.weight"),
            qkv_bias=bias,
            q_norm=get(a + "q_norm.weight") if c.qk_norm else None,
            k_norm=get(a + "k_norm.weight") if c.qk_norm else None,
            o=get(a + "o_proj.weight"),
            attn_out_norm=get(p + "post_attention_layernorm.weight") if sandwich else None,
            post_norm=get(p + ("pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight")),
            gate_up=None if sparse else fused([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"],
                                              p + "mlp.gate_up_proj.weight"),
            down=None if sparse else get(p + "mlp.down_proj.weight"),
            mlp_out_norm=get(p + "post_feedforward_layernorm.weight") if sandwich else None,
            window=c.layer_window(i),
            sliding_rope=c.layer_uses_sliding_rope(i),
            moe=sparse,
            o_bias=get(a + "o_proj.bias") if c.output_bias else None,
            sinks=get(a + "sinks") if c.attention_sinks else None,
        ))
    packed = any(isinstance(t, PackedLinear) for t in [embed, head] + [t for lr in layers for t in lr.weights()])
    weight_format = fmt if packed else "dense"  # a GGUF without quantized matrices loads dense
    if isinstance(head, PackedLinear):
        lm_head = head
    elif packed:
        # (a state dict built in memory; the GGUF loader packs a dense head itself) the output head is a decode
        # step's largest matrix: 8-bit, its prompt-row weights the dense head itself where the layers keep theirs
        dense_copy = all(t.dense is not None for lr in layers for t in lr.weights() if isinstance(t, PackedLinear))
        lm_head = Q8Linear.quantize(head, keep_dense=dense_copy)
    else:
        lm_head = kernels.pad_embedding(head)  # a copy where the vocabulary is padded
        if head is embed and lm_head is not head:  # tied: the embedding is a view of the padded head, not a second table
            embed = lm_head[: embed.shape[0]]
    if moved:
        group_head(lm_head)
        group_matrices(layers)
    return ModelWeights(embed, lm_head, norm, layers, weight_format)


def group_matrices(layers: list[Layer]) -> None:
    """The decoder layers' q4 and q5 matrices regrouped 16 rows at a time (kernels/cpu/affine_groups.h: decode rows
    without the per-row tile's horizontal sums, the same bits), parts of a matrix kept in parts too; after their
    bytes have moved, as regrouping reads them. Experts keep their rows (the MoE kernel's per-row tasks read
    rows). (q5 groups are new tensors: the heap the rows leave goes back with load()'s trim, or settling's.)"""
    for layer in layers:
        for t in (layer.qkv, layer.o, layer.gate_up, layer.down):
            for part in t.parts if isinstance(t, PartsLinear) else [t]:
                if isinstance(part, AffineLinear):
                    part.group()


def group_head(lm_head) -> None:
    """A q8 output head's rows regrouped in place (its 8-row calls, 8 chats, then read it with no panels to
    unpack: kernels/cpu/q8.h); after its bytes have moved, as regrouping reads them."""
    if isinstance(lm_head, Q8Linear) and not lm_head.prompt_dense:
        lm_head.group()

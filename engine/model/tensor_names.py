"""The tensors a model config has: their HF names and shapes, and the checks a loaded state dict passes
(every name present, none unknown, every shape right), shared by the safetensors and GGUF readers."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.model import moe
from engine.model.packing import repack
from engine.model.config import ModelConfig


def expected_tensor_names(config: ModelConfig) -> list[str]:
    """Every tensor name load_weights returns for this config, in model order."""
    names = ["model.embed_tokens.weight"]
    fused = config.fused_projections
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        names += [p + "self_attn.qkv_proj.weight"] if fused else [p + f"self_attn.{x}_proj.weight" for x in "qkv"]
        names.append(p + "self_attn.o_proj.weight")
        if config.attention_bias:
            names += [p + "self_attn.qkv_proj.bias"] if fused else [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
        if config.output_bias:
            names.append(p + "self_attn.o_proj.bias")
        if config.attention_sinks:
            names.append(p + "self_attn.sinks")
        if config.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        if config.layer_is_sparse(i):
            names += moe.tensor_names(config, p)
        else:
            mlp = ["mlp.gate_up_proj.weight"] if fused else ["mlp.gate_proj.weight", "mlp.up_proj.weight"]
            names += [p + n for n in mlp]
            names.append(p + "mlp.down_proj.weight")
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        if config.sandwich_norm:
            names += [p + "pre_feedforward_layernorm.weight", p + "post_feedforward_layernorm.weight"]
    names.append("model.norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def tensor_shapes(c: ModelConfig, names: list[str] | None = None) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for every weight of a config (or for `names`, fused ones among them)."""
    q, kv, h, i = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size, c.intermediate_size
    by_suffix = {  # longest suffixes first: "qkv_proj.weight" also ends in "v_proj.weight"
        "embed_tokens.weight": (c.vocab_size, h), "lm_head.weight": (c.vocab_size, h),
        "qkv_proj.weight": (q + 2 * kv, h), "qkv_proj.bias": (q + 2 * kv,), "gate_up_proj.weight": (2 * i, h),
        "q_proj.weight": (q, h), "k_proj.weight": (kv, h), "v_proj.weight": (kv, h), "o_proj.weight": (h, q),
        "q_proj.bias": (q,), "k_proj.bias": (kv,), "v_proj.bias": (kv,), "o_proj.bias": (h,),
        "self_attn.sinks": (c.num_heads,),
        "q_norm.weight": (c.head_dim,), "k_norm.weight": (c.head_dim,),
        "gate_proj.weight": (i, h), "up_proj.weight": (i, h), "down_proj.weight": (h, i),
        "layernorm.weight": (h,), "norm.weight": (h,),
    }
    return {n: moe.tensor_shape(c, n) or next(s for k, s in by_suffix.items() if n.endswith(k))
            for n in (expected_tensor_names(c) if names is None else names)}


def keeps_dense_copy(config: ModelConfig, fmt: str, stored_type) -> bool:
    """repack's dense-copy rule over the matrices this format packs (stored_type: HF name -> ggml type)."""
    packed = sum(torch.Size(shape).numel() for name, shape in tensor_shapes(config).items()
                 if repack.keeps_packed(name, stored_type(name) or "F32", len(shape), fmt))
    return repack.keeps_dense_copy(packed)


def check_names(source: Path, expected: list[str], state: dict, unexpected: list[str]) -> None:
    missing = [n for n in expected if n not in state]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"{source} is missing tensors: {', '.join(missing[:5])}{more}")
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        raise ValueError(
            f"{source} has tensors this architecture does not use (unsupported variant?): "
            f"{', '.join(unexpected[:5])}{more}"
        )


def check_shapes(source: Path, c: ModelConfig, state: dict[str, torch.Tensor]) -> None:
    """Every tensor of a state dict that passed check_names (the loader may have fused some) has its shape."""
    for name, shape in tensor_shapes(c, list(state)).items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"{source}: tensor {name} has shape {tuple(state[name].shape)}, expected {shape}")

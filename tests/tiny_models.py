"""Tiny random-weight Hugging Face models written to disk by transformers, for peer tests.

Weights are drawn with a large spread (and random norm weights / biases) so logits are far from flat:
greedy comparisons then test the arithmetic rather than tie-breaking, and a wrong norm or bias shows.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

ARCHS = ("llama", "llama3", "mistral", "qwen2", "qwen3")
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # small, so all three frequency bands occur
WEIGHT_STD = 0.25


@lru_cache(maxsize=1)
def default_tokenizer():
    from engine.model.tokenizer import Tokenizer

    return Tokenizer.load()


def tiny_config(arch: str = "llama", *, rope_scaling: dict | None = None, tie: bool = True, **overrides):
    """The transformers config object of a tiny model of `arch`."""
    import transformers

    if arch == "llama3":
        arch, rope_scaling = "llama", rope_scaling or LLAMA3_ROPE
    classes = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
               "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}
    if arch not in classes:
        raise ValueError(f"unknown tiny model arch {arch!r}; choose from {ARCHS}")
    kwargs = dict(vocab_size=default_tokenizer().vocab_size, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=tie,
                  bos_token_id=1, eos_token_id=2, pad_token_id=2)
    if rope_scaling is not None:
        kwargs["rope_scaling"] = dict(rope_scaling)
    kwargs.update(overrides)
    return classes[arch](**kwargs)


def write_tiny_model(folder: str | Path, arch: str = "llama", *, rope_scaling: dict | None = None, tie: bool = True,
                     sharded: bool = False, seed: int = 0, **overrides) -> Path:
    """Write an HF model folder (config, safetensors, default tokenizer) and return its path."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    config = tiny_config(arch, rope_scaling=rope_scaling, tie=tie, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, WEIGHT_STD if p.dim() > 1 else 0.5)
    if tie:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="1MB" if sharded else "10GB")
    default_tokenizer().save(folder)
    return folder


# ---------------------------------------------------------------- tiny GGUF files (llama.cpp conventions)

_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf: str) -> str:
    """llama.cpp's name for an HF tensor name (written independently of engine.model.weights' mapping)."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    module, _, suffix = rest.rpartition(".")
    return f"blk.{layer}.{_GGUF_NAMES[module]}.{suffix}"


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF rotate_half row order -> llama.cpp's interleaved order (what convert_hf_to_gguf.py writes)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """The rope_freqs tensor llama.cpp stores for Llama-3 scaling: a divisor per frequency."""
    import math

    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for f in inv.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def write_tiny_gguf(hf_folder: str | Path, out: str | Path, qtype: str = "F32", *, tokenizer: bool = True) -> Path:
    """Convert a tiny HF folder to GGUF the way llama.cpp does (q/k permuted for llama; 2-D weights in qtype)."""
    import json

    import gguf
    import numpy as np
    from safetensors.torch import load_file

    hf_folder, out = Path(hf_folder), Path(out)
    cfg = json.loads((hf_folder / "config.json").read_text())
    files = sorted(hf_folder.glob("*.safetensors"))
    state = {k: v for f in files for k, v in load_file(f).items()}
    arch = {"mistral": "llama"}.get(cfg["model_type"], cfg["model_type"])
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    rope = cfg.get("rope_parameters") or {}
    w = gguf.GGUFWriter(out, arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg["head_dim"], rope["rope_theta"], rope).numpy())
    if tokenizer:
        _copy_default_tokenizer_metadata(w)
    quant = gguf.GGMLQuantizationType[qtype]
    for name, t in state.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        t = t.float()
        if arch == "llama" and "q_proj" in name:
            t = llama_cpp_permute(t, heads)
        elif arch == "llama" and "k_proj" in name:
            t = llama_cpp_permute(t, kv_heads)
        if t.dim() == 2 and quant != gguf.GGMLQuantizationType.F32:
            w.add_tensor(gguf_name(name), gguf.quants.quantize(t.numpy(), quant), raw_dtype=quant)
        else:
            w.add_tensor(gguf_name(name), np.ascontiguousarray(t.numpy()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _copy_default_tokenizer_metadata(w) -> None:
    from engine.model.weights import GGUFFile, default_model_path

    meta = GGUFFile(default_model_path()).metadata
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    w.add_chat_template(meta["tokenizer.chat_template"])


# ---------------------------------------------------------------- transformers peers of the default model

@lru_cache(maxsize=1)
def hf_default_model():
    """transformers' own GGUF loader on the default model (slow: ~40 s on 2 cores, so loaded once)."""
    from transformers import AutoModelForCausalLM

    from engine.model.weights import default_model_path

    path = default_model_path()
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


@lru_cache(maxsize=1)
def hf_default_tokenizer():
    from transformers import AutoTokenizer

    from engine.model.weights import default_model_path

    path = default_model_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)

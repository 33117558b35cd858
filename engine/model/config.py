"""ModelConfig: the architecture facts the engine needs, read from HF config.json or GGUF metadata.

One flat dataclass for the whole Llama family, so the model code branches on features
(attention_bias, qk_norm) rather than on architecture names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "freq_factors")

# HF `model_type` / `architectures[0]` -> our arch name.
_HF_ARCHS = {
    "llama": "llama", "LlamaForCausalLM": "llama",
    "mistral": "mistral", "MistralForCausalLM": "mistral",
    "qwen2": "qwen2", "Qwen2ForCausalLM": "qwen2",
    "qwen3": "qwen3", "Qwen3ForCausalLM": "qwen3",
}
# GGUF `general.architecture` -> our arch name (llama.cpp writes Mistral as "llama").
_GGUF_ARCHS = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}


def _unsupported(name: Any, source: str) -> ValueError:
    return ValueError(
        f"Unsupported model architecture {name!r} in {source}; supported architectures: {', '.join(SUPPORTED_ARCHS)}."
    )


@dataclass
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    # Mistral v0.1-style sliding-window attention; None = full attention. Exact as long as sequences
    # stay within the window, so the engine must cap sequence length at it (see max_seq_len).
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise _unsupported(self.arch, "ModelConfig")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type")
            if kind not in SUPPORTED_ROPE_TYPES:
                raise NotImplementedError(
                    f"RoPE scaling type {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
                )
            if kind == "default":
                self.rope_scaling = None

    @property
    def max_seq_len(self) -> int:
        """Longest sequence this model computes exactly (sliding window attention is not implemented)."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    # ---------------------------------------------------------------- HF config.json
    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        """Build from a parsed Hugging Face config.json (transformers v4 or v5 layout)."""
        name = cfg.get("model_type") or (cfg.get("architectures") or [None])[0]
        arch = _HF_ARCHS.get(name)
        if arch is None and cfg.get("architectures"):
            arch = _HF_ARCHS.get(cfg["architectures"][0])
        if arch is None:
            raise _unsupported(name, "config.json (model_type)")
        try:
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            head_dim = cfg.get("head_dim") or hidden // heads
            theta, scaling = _hf_rope(cfg)
            sliding = None
            if arch == "mistral" or cfg.get("use_sliding_window"):
                sliding = cfg.get("sliding_window")
            if arch == "qwen2":
                attention_bias = True  # Qwen2 always has q/k/v biases; its config has no flag
            else:
                attention_bias = bool(cfg.get("attention_bias", False))
            if cfg.get("mlp_bias"):
                raise NotImplementedError("mlp_bias=True (MLP biases) is not supported")
            if cfg.get("hidden_act", "silu") != "silu":
                raise NotImplementedError(f"hidden_act {cfg.get('hidden_act')!r} is not supported (only silu)")
            eos = cfg.get("eos_token_id")
            return cls(
                arch=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                rope_theta=theta,
                rope_scaling=scaling,
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=attention_bias,
                qk_norm=arch == "qwen3",
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=_as_id_list(eos),
                sliding_window=int(sliding) if sliding else None,
            )
        except KeyError as e:
            raise ValueError(f"config.json is missing required key {e.args[0]!r}") from None

    # ---------------------------------------------------------------- GGUF metadata
    @classmethod
    def from_gguf(cls, reader: Any) -> ModelConfig:
        """Build from GGUF metadata: an engine.model.weights.GGUFFile or a gguf.GGUFReader."""
        meta = _gguf_metadata(reader)
        name = meta.get("general.architecture")
        arch = _GGUF_ARCHS.get(name)
        if arch is None:
            raise _unsupported(name, "GGUF metadata (general.architecture)")

        def get(key: str, default: Any = KeyError) -> Any:
            value = meta.get(f"{name}.{key}", default)
            if value is KeyError:
                raise ValueError(f"GGUF metadata is missing {name}.{key}")
            return value

        hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
        kv_heads = get("attention.head_count_kv", heads)
        if isinstance(kv_heads, list):
            raise NotImplementedError("per-layer KV head counts in GGUF are not supported")
        head_dim = int(get("attention.key_length", 0) or hidden // heads)
        rope_dim = get("rope.dimension_count", head_dim)
        if rope_dim != head_dim:
            raise NotImplementedError(f"partial rotary embeddings (rope dim {rope_dim} < head dim {head_dim})")
        tensors = _gguf_tensor_names(reader)
        vocab = get("vocab_size", None) or len(meta.get("tokenizer.ggml.tokens", ())) or _gguf_embedding_rows(reader)
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            arch=arch,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=int(get("block_count")),
            num_heads=heads,
            num_kv_heads=int(kv_heads),
            head_dim=head_dim,
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=_gguf_rope(meta, name, reader),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            tie_word_embeddings="output.weight" not in tensors,
            attention_bias="blk.0.attn_q.bias" in tensors,
            qk_norm="blk.0.attn_q_norm.weight" in tensors,
            max_position_embeddings=int(get("context_length", 4096)),
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=_as_id_list(eos),
            sliding_window=get("attention.sliding_window", None) or None,
        )

    # ---------------------------------------------------------------- rotary
    def rope_inv_freq(self) -> torch.Tensor:
        """Inverse rotary frequencies (float32, head_dim // 2), scaled exactly as transformers does."""
        dim = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        s = self.rope_scaling
        if s is None:
            return inv_freq
        kind = s["rope_type"]
        if kind == "linear":
            return inv_freq / float(s["factor"])
        if kind == "freq_factors":  # llama.cpp's rope_freqs tensor: per-frequency divisors
            factors = torch.tensor(s["factors"], dtype=torch.float32)
            if factors.numel() != inv_freq.numel():
                raise ValueError(f"rope freq factors have {factors.numel()} entries, expected {inv_freq.numel()}")
            return inv_freq / factors
        # llama3: long wavelengths divided by factor, short kept, a smooth blend in between.
        factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old_ctx = float(s["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _hf_rope(cfg: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either transformers v5 `rope_parameters` or v4 `rope_scaling`."""
    params = dict(cfg.get("rope_parameters") or {})
    legacy = cfg.get("rope_scaling") or {}
    params = {**legacy, **params}
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind == "default":
        return theta, None
    if kind not in SUPPORTED_ROPE_TYPES:
        raise NotImplementedError(
            f"RoPE scaling type {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if kind == "llama3":
        params.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
        missing = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} - {
            k for k, v in params.items() if v is not None}
        if missing:
            raise ValueError(f"llama3 rope scaling is missing {sorted(missing)}")
    if kind == "linear" and "factor" not in params:
        raise ValueError("linear rope scaling is missing 'factor'")
    return theta, {"rope_type": kind, **params}


def _gguf_rope(meta: dict, name: str, reader: Any) -> dict | None:
    kind = meta.get(f"{name}.rope.scaling.type", "none")
    factors = _gguf_rope_freqs(reader)
    if factors is not None:
        return {"rope_type": "freq_factors", "factors": factors}
    if kind in ("none", None):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(meta[f"{name}.rope.scaling.factor"])}
    raise NotImplementedError(f"GGUF rope scaling type {kind!r} is not supported (only none, linear, rope_freqs)")


def _gguf_metadata(reader: Any) -> dict:
    meta = getattr(reader, "metadata", None)
    if isinstance(meta, dict):
        return meta
    fields = getattr(reader, "fields", None)  # gguf.GGUFReader
    if fields is None:
        raise TypeError(f"from_gguf needs an engine.model.weights.GGUFFile or gguf.GGUFReader, "
                        f"got {type(reader).__name__}")
    big = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
    return {key: f.contents() for key, f in fields.items() if key not in big}


def _gguf_tensor_names(reader: Any) -> set[str]:
    return {t.name for t in reader.tensors}


def _gguf_embedding_rows(reader: Any) -> int:
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            # engine.model.weights.GGUFFile lists shapes rows-first; gguf.GGUFReader in ggml order (rows last)
            return int(t.shape[0] if isinstance(getattr(reader, "metadata", None), dict) else t.shape[-1])
    raise ValueError("GGUF file has no vocab_size, token list or token_embd.weight to size the vocabulary")


def _gguf_rope_freqs(reader: Any) -> list[float] | None:
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            if hasattr(reader, "tensor"):
                return reader.tensor(t.name, torch.float32).tolist()
            return [float(x) for x in t.data]
    return None

"""ModelConfig: the architecture facts the engine needs, read from HF config.json or GGUF metadata.

One flat dataclass for every supported decoder, so the model code branches on features (attention_bias,
qk_norm, sandwich_norm, softcaps, sliding windows, ...) rather than on architecture names. Only the two
readers here know which architecture implies which feature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from . import rope, vlm_text

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "qwen3moe", "mixtral",
                   "gpt-oss")
MOE_ARCHS = ("qwen3moe", "mixtral", "gpt-oss")  # mixture-of-experts feed-forward (engine.model.moe)
SUPPORTED_ROPE_TYPES = rope.SUPPORTED_ROPE_TYPES
ACTIVATIONS = ("silu", "gelu_tanh")  # gated MLP: SwiGLU, GeGLU
SLIDING, FULL = "sliding_attention", "full_attention"  # HF's layer_types values

# HF `model_type` / `architectures[0]` -> our arch name.
_HF_ARCHS = {
    "llama": "llama", "LlamaForCausalLM": "llama",
    "mistral": "mistral", "MistralForCausalLM": "mistral",
    "qwen2": "qwen2", "Qwen2ForCausalLM": "qwen2",
    "qwen3": "qwen3", "Qwen3ForCausalLM": "qwen3",
    "gemma": "gemma", "GemmaForCausalLM": "gemma",
    "gemma2": "gemma2", "Gemma2ForCausalLM": "gemma2",
    "gemma3_text": "gemma3", "Gemma3ForCausalLM": "gemma3",
    "phi3": "phi3", "Phi3ForCausalLM": "phi3",
    "qwen3_moe": "qwen3moe", "Qwen3MoeForCausalLM": "qwen3moe",
    "mixtral": "mixtral", "MixtralForCausalLM": "mixtral",
    "gpt_oss": "gpt-oss", "GptOssForCausalLM": "gpt-oss",
}
# GGUF `general.architecture` -> our arch name (llama.cpp writes Mistral as "llama").
_GGUF_ARCHS = {a: a for a in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "qwen3moe",
                               "gpt-oss")}
_GGUF_MOE_ARCHS = ("qwen3moe", "gpt-oss")  # MoE GGUF files read (Mixtral's, written as "llama", are not yet)
_GEMMAS = ("gemma", "gemma2", "gemma3")
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
# gpt-oss's experts (engine.model.moe); llama.cpp hard-codes its SwiGLU's limit 7 and alpha 1.702
_GPT_OSS_EXPERTS = dict(norm_topk_prob=True, router_bias=True, expert_bias=True, moe_routing="topk_softmax")


def _unsupported(name: Any, source: str) -> ValueError:
    return ValueError(
        f"Unsupported model architecture {name!r} in {source}; supported architectures: {', '.join(SUPPORTED_ARCHS)}."
    )


def _moe(name: Any, experts: Any, gguf: bool = False) -> NotImplementedError:
    what = "in a GGUF file" if gguf else "of a family pagedeck does not run"
    return NotImplementedError(
        f"{name} is a mixture-of-experts model ({experts} experts) {what}, which is not supported yet: of MoE "
        f"models pagedeck runs Qwen3-MoE and gpt-oss (HF safetensors folders and GGUF files) and Mixtral (HF folders "
        f"only).")


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
    # Sliding-window attention: layers named SLIDING in layer_types (all layers when layer_types is None)
    # see only the last `sliding_window` positions.
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    hidden_act: str = "silu"  # gated MLP activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma)
    norm_weight_offset: float = 0.0  # stored RMSNorm weights are (scale - offset): HF Gemma's (1 + w)
    sandwich_norm: bool = False  # RMSNorms on the attention and MLP outputs too (Gemma 2/3)
    embedding_scale: float | None = None  # token embeddings are multiplied by it (Gemma: sqrt(hidden))
    query_pre_attn_scalar: float | None = None  # attention scale = its ** -0.5 (Gemma); None: head_dim
    attn_softcap: float | None = None  # scores -> c * tanh(s / c) (Gemma 2)
    final_softcap: float | None = None  # logits -> c * tanh(l / c) (Gemma 2)
    sliding_rope_theta: float | None = None  # sliding layers' own rope base, unscaled (Gemma 3)
    rotary_dim: int | None = None  # rotate only each head's first dims (partial rotary); None: all
    fused_projections: bool = False  # the checkpoint stores qkv_proj and gate_up_proj fused (Phi-3)
    output_bias: bool = False  # the attention output projection has a bias (gpt-oss)
    # learned per-head attention sinks (gpt-oss): one more logit in each head's softmax denominator, no value
    attention_sinks: bool = False
    # Mixture of experts (engine.model.moe): a sparse layer's MLP is a router over num_experts gated MLPs of
    # moe_intermediate_size, of which each token runs its experts_per_token best (weights renormalised to sum
    # to 1 where norm_topk_prob). sparse_layers: which layers are sparse (None: all of them, when num_experts).
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    sparse_layers: list[bool] | None = None
    # gpt-oss's experts: biases on the router and on each expert's gate|up and down, weights a softmax over
    # the top-k router logits (moe_routing "topk_softmax"; else "softmax_topk": softmax over all, then top-k),
    # and the clamped SwiGLU where swiglu_limit is set: gate <= limit, -limit <= up <= limit,
    # out = (up + 1) * gate * sigmoid(swiglu_alpha * gate)
    router_bias: bool = False
    expert_bias: bool = False
    moe_routing: str = "softmax_topk"
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.0

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
        rot = self.rotary_dims
        if rot % 2 or not 0 < rot <= self.head_dim:
            raise ValueError(f"rotary dims must be even and within head_dim {self.head_dim}, got {rot}")
        if self.hidden_act not in ACTIVATIONS:
            raise NotImplementedError(f"hidden activation {self.hidden_act!r} is not supported; supported: "
                                      f"{', '.join(ACTIVATIONS)}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers or set(self.layer_types) - {SLIDING, FULL}:
                raise ValueError(f"layer_types must name {self.num_layers} layers as {SLIDING!r} or {FULL!r}")
            if SLIDING in self.layer_types and not self.sliding_window:
                raise ValueError("layer_types has sliding-window layers but sliding_window is not set")
        if self.num_experts:
            if not 0 < self.experts_per_token <= self.num_experts or self.moe_intermediate_size <= 0:
                raise ValueError(f"MoE config needs 0 < experts_per_token ({self.experts_per_token}) <= num_experts "
                                 f"({self.num_experts}) and a positive moe_intermediate_size")
            if self.sparse_layers is not None and len(self.sparse_layers) != self.num_layers:
                raise ValueError(f"sparse_layers must name {self.num_layers} layers")
            if self.moe_routing not in ("softmax_topk", "topk_softmax"):
                raise ValueError(f"moe_routing must be 'softmax_topk' or 'topk_softmax', got {self.moe_routing!r}")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type")
            if kind not in SUPPORTED_ROPE_TYPES:
                raise rope.unsupported_rope(kind)
            if kind == "default":
                self.rope_scaling = None

    # ---------------------------------------------------------------- derived facts
    @property
    def max_seq_len(self) -> int:
        """Longest sequence this model computes exactly (sliding windows are implemented, so no cap)."""
        return self.max_position_embeddings

    @property
    def rotary_dims(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def layer_is_sparse(self, i: int) -> bool:
        """Whether layer i's MLP is a mixture of experts."""
        return bool(self.num_experts) and (self.sparse_layers is None or self.sparse_layers[i])

    def inactive_expert_parameters(self) -> int:
        """Parameters a token never reads: in every sparse layer, the experts it does not choose (0 if dense)."""
        if not self.num_experts:
            return 0
        sparse = sum(self.layer_is_sparse(i) for i in range(self.num_layers))
        return sparse * (self.num_experts - self.experts_per_token) * 3 * self.hidden_size * self.moe_intermediate_size

    def layer_window(self, i: int) -> int | None:
        """The sliding window of layer i, or None where it attends to everything."""
        if not self.sliding_window:
            return None
        if self.layer_types is None or self.layer_types[i] == SLIDING:
            return self.sliding_window
        return None

    def layer_uses_sliding_rope(self, i: int) -> bool:
        return self.sliding_rope_theta is not None and self.layer_window(i) is not None

    # ---------------------------------------------------------------- rotary
    def rope_inv_freq(self, long: bool = False) -> torch.Tensor:
        """Inverse rotary frequencies (float32, rotary_dims // 2), scaled exactly as transformers does;
        long=True picks LongRoPE's long-context factors."""
        return rope.inv_freq(self.rotary_dims, self.rope_theta, self.rope_scaling, long)

    def sliding_rope_inv_freq(self) -> torch.Tensor:
        return rope.inv_freq(self.rotary_dims, self.sliding_rope_theta, None)

    @property
    def rope_attention_factor(self) -> float:
        return rope.attention_factor(self.rope_scaling)

    @property
    def long_rope_threshold(self) -> int | None:
        """Contexts longer than this use LongRoPE's long factors (None: the rope has one set)."""
        s = self.rope_scaling
        return int(s["original_max_position_embeddings"]) if s and s["rope_type"] == "longrope" else None

    # ---------------------------------------------------------------- HF config.json
    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        """Build from a parsed Hugging Face config.json (transformers v4 or v5 layout)."""
        # vision-language checkpoints (Gemma 3 4B+, Idefics3/SmolVLM): the text decoder is text_config
        cfg = vlm_text.text_config(cfg)
        name = cfg.get("model_type") or (cfg.get("architectures") or [None])[0]
        experts = next((cfg[k] for k in _MOE_KEYS if cfg.get(k)), None)
        arch = _HF_ARCHS.get(name)
        if arch is None and cfg.get("architectures"):
            arch = _HF_ARCHS.get(cfg["architectures"][0])
        if (experts or "moe" in str(name).lower()) and arch not in MOE_ARCHS:
            raise _moe(name, experts or "several")
        if arch is None:
            raise _unsupported(name, "config.json (model_type)")
        try:
            return cls(**_hf_fields(arch, cfg))
        except KeyError as e:
            raise ValueError(f"config.json is missing required key {e.args[0]!r}") from None

    # ---------------------------------------------------------------- GGUF metadata
    @classmethod
    def from_gguf(cls, reader: Any) -> ModelConfig:
        """Build from GGUF metadata: an engine.model.gguf.file.GGUFFile or a gguf.GGUFReader."""
        meta = _gguf_metadata(reader)
        name = meta.get("general.architecture")
        experts = meta.get(f"{name}.expert_count")
        if (experts or "moe" in str(name).lower()) and name not in _GGUF_MOE_ARCHS:
            raise _moe(name, experts or "several", gguf=True)
        arch = _GGUF_ARCHS.get(name)
        if arch is None:
            raise _unsupported(name, "GGUF metadata (general.architecture)")
        return cls(**_gguf_fields(arch, name, meta, reader))


def _hf_fields(arch: str, cfg: dict) -> dict:
    hidden, heads, n_layers = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    params = cfg.get("rope_parameters") or {}
    sliding_rope = None
    if SLIDING in params or FULL in params:  # v5 per-layer-type rope (Gemma 3)
        theta, scaling = rope.hf_rope(params.get(FULL) or {}, cfg)
        sliding_theta, sliding_scaling = rope.hf_rope(params.get(SLIDING) or {}, cfg)
        if sliding_scaling is not None:
            raise NotImplementedError("scaled rope on sliding-window layers is not supported")
        sliding_rope = sliding_theta
    else:
        theta, scaling = rope.hf_rope({**(cfg.get("rope_scaling") or {}), **params}, cfg)
        if arch == "gemma3":  # v4 layout: a plain local base beside the (scaled) global one
            sliding_rope = float(cfg.get("rope_local_base_freq", 10000.0))
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor")) or 1.0
    if cfg.get("mlp_bias"):
        raise NotImplementedError("mlp_bias=True (MLP biases) is not supported")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    act = {"swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}.get(act, act)
    if arch in _GEMMAS and act == "gelu":
        act = "gelu_tanh"  # Gemma 1 configs say "gelu"; transformers runs (and trained) the tanh form
    qwen = arch in ("qwen2", "qwen3", "qwen3moe")
    sliding = cfg.get("sliding_window") if not qwen or cfg.get("use_sliding_window") else None
    gemma = arch in _GEMMAS
    return dict(
        arch=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
        # Qwen2 always has q/k/v biases; its config has no flag
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=arch in ("qwen3", "gemma3", "qwen3moe"),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_as_id_list(cfg.get("eos_token_id")),
        sliding_window=int(sliding) if sliding else None,
        layer_types=_hf_layer_types(arch, cfg, n_layers) if sliding else None,
        hidden_act=act,
        norm_weight_offset=1.0 if gemma else 0.0,
        sandwich_norm=arch in ("gemma2", "gemma3"),
        embedding_scale=math.sqrt(hidden) if gemma else None,
        query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]) if gemma and cfg.get("query_pre_attn_scalar") else None,
        # Gemma 3 configs may carry attn_logit_softcapping, but transformers never applies it there
        attn_softcap=_positive(cfg.get("attn_logit_softcapping")) if arch == "gemma2" else None,
        final_softcap=_positive(cfg.get("final_logit_softcapping")) if gemma else None,
        sliding_rope_theta=sliding_rope,
        rotary_dim=int(head_dim * partial) if partial != 1.0 else None,
        fused_projections=arch == "phi3",
        output_bias=arch == "gpt-oss" and bool(cfg.get("attention_bias", True)),
        attention_sinks=arch == "gpt-oss",
        **_hf_moe_fields(arch, cfg, n_layers),
    )


def _hf_moe_fields(arch: str, cfg: dict, n: int) -> dict:
    """The experts of a Qwen3-MoE, Mixtral or gpt-oss config.json. Qwen3-MoE: layer i is sparse unless listed
    in mlp_only_layers, every decoder_sparse_step-th layer, its experts moe_intermediate_size wide (dense
    layers intermediate_size); Mixtral: every layer, experts intermediate_size wide, weights always
    renormalised; gpt-oss: every layer, experts intermediate_size wide, biased, softmax over the top k,
    clamped SwiGLU."""
    if arch not in MOE_ARCHS:
        return {}
    experts = int(next((cfg[k] for k in _MOE_KEYS if cfg.get(k)), 0))
    if arch == "gpt-oss":
        return dict(num_experts=experts, experts_per_token=int(cfg["num_experts_per_tok"]),
                    moe_intermediate_size=int(cfg["intermediate_size"]), **_GPT_OSS_EXPERTS,
                    swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
                    swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)))
    if arch == "mixtral":
        return dict(num_experts=experts, experts_per_token=int(cfg["num_experts_per_tok"]),
                    moe_intermediate_size=int(cfg["intermediate_size"]), norm_topk_prob=True)
    step, dense = int(cfg.get("decoder_sparse_step", 1) or 1), set(cfg.get("mlp_only_layers") or ())
    sparse = [i not in dense and (i + 1) % step == 0 for i in range(n)]
    return dict(num_experts=experts, experts_per_token=int(cfg["num_experts_per_tok"]),
                moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                norm_topk_prob=bool(cfg.get("norm_topk_prob", False)), sparse_layers=None if all(sparse) else sparse)


def _hf_layer_types(arch: str, cfg: dict, n: int) -> list[str] | None:
    """HF's per-layer attention kinds, from the config or rebuilt the way transformers builds them."""
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    if arch == "gemma2":
        return [SLIDING if (i + 1) % 2 else FULL for i in range(n)]
    if arch == "gemma3":
        pattern = int(cfg.get("sliding_window_pattern", 6))
        return [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
    if arch in ("qwen2", "qwen3", "qwen3moe"):
        first = int(cfg.get("max_window_layers", n))
        return [SLIDING if i >= first else FULL for i in range(n)]
    return None  # every layer


def _gguf_fields(arch: str, name: str, meta: dict, reader: Any) -> dict:
    def get(key: str, default: Any = KeyError) -> Any:
        value = meta.get(f"{name}.{key}", default)
        if value is KeyError:
            raise ValueError(f"GGUF metadata is missing {name}.{key}")
        return value

    hidden, heads, n_layers = int(get("embedding_length")), int(get("attention.head_count")), int(get("block_count"))
    kv_heads = get("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise NotImplementedError("per-layer KV head counts in GGUF are not supported")
    head_dim = int(get("attention.key_length", 0) or hidden // heads)
    rope_dim = int(get("rope.dimension_count", head_dim))
    tensors = _gguf_tensor_names(reader)
    vocab = get("vocab_size", None) or len(meta.get("tokenizer.ggml.tokens", ())) or _gguf_embedding_rows(reader)
    _check_vocabulary(meta, reader, tensors)
    gemma = arch in _GEMMAS
    sliding = get("attention.sliding_window", None) or None
    scaling = rope.gguf_rope(meta, name, lambda n: _gguf_small_tensor(reader, n))
    return dict(
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=head_dim,
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors or "blk.0.attn_qkv.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        max_position_embeddings=int(get("context_length", 4096)),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=_as_id_list(meta.get("tokenizer.ggml.eos_token_id")),
        sliding_window=int(sliding) if sliding else None,
        layer_types=_gguf_layer_types(arch, get("attention.sliding_window_pattern", None), n_layers) if sliding else None,
        hidden_act="gelu_tanh" if gemma else "silu",
        norm_weight_offset=0.0,  # llama.cpp's converter already stored Gemma's (1 + w)
        # gpt-oss's post_attention_norm is the MLP's input norm (HF's post_attention_layernorm), not a sandwich
        sandwich_norm="blk.0.post_attention_norm.weight" in tensors and arch != "gpt-oss",
        embedding_scale=math.sqrt(hidden) if gemma else None,
        query_pre_attn_scalar=_gguf_query_scalar(arch, get("attention.scale", None), hidden, heads, head_dim, n_layers),
        attn_softcap=_positive(get("attn_logit_softcapping", None)),
        final_softcap=_positive(get("final_logit_softcapping", None)),
        # llama.cpp hard-codes Gemma 3's local base when the file does not name one
        sliding_rope_theta=float(get("rope.freq_base_swa", 10000.0)) if arch == "gemma3" else None,
        rotary_dim=rope_dim if rope_dim != head_dim else None,
        fused_projections="blk.0.attn_qkv.weight" in tensors,
        output_bias="blk.0.attn_output.bias" in tensors,
        attention_sinks="blk.0.attn_sinks.weight" in tensors,
        **_gguf_moe_fields(arch, get, tensors, n_layers),
    )


def _gguf_moe_fields(arch: str, get: Any, tensors: set[str], n: int) -> dict:
    """A MoE GGUF's experts (llama.cpp's keys); a layer is sparse where it has a router (ffn_gate_inp).
    llama.cpp renormalises Qwen3-MoE's top-k weights unless the file says otherwise (expert_weights_norm);
    gpt-oss's routing and SwiGLU are fixed in llama.cpp's code, not the file."""
    experts = get("expert_count", 0)
    if not experts:
        return {}
    sparse = [f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(n)]
    if arch == "gpt-oss":
        return dict(num_experts=int(experts), experts_per_token=int(get("expert_used_count")),
                    moe_intermediate_size=int(get("expert_feed_forward_length")), **_GPT_OSS_EXPERTS,
                    swiglu_limit=7.0, swiglu_alpha=1.702, sparse_layers=None if all(sparse) else sparse)
    return dict(num_experts=int(experts), experts_per_token=int(get("expert_used_count")),
                moe_intermediate_size=int(get("expert_feed_forward_length")),
                norm_topk_prob=bool(get("expert_weights_norm", True)), sparse_layers=None if all(sparse) else sparse)


def _gguf_layer_types(arch: str, pattern: Any, n: int) -> list[str] | None:
    """llama.cpp's sliding-window layout: a per-layer bool array if the file has one, else its per-arch
    period (Gemma 2, gpt-oss: every other layer, Gemma 3: five of every six); other archs window every layer."""
    if isinstance(pattern, list):
        return [SLIDING if p else FULL for p in pattern]
    period = (int(pattern) if isinstance(pattern, int) and pattern > 0
              else {"gemma2": 2, "gemma3": 6, "gpt-oss": 2}.get(arch))
    if period is None:
        return None
    return [SLIDING if i % period < period - 1 else FULL for i in range(n)]


def _gguf_query_scalar(arch: str, scale: Any, hidden: int, heads: int, head_dim: int, n_layers: int) -> float | None:
    """GGUF has no query_pre_attn_scalar: llama.cpp uses 1/sqrt(hidden / heads) for the 27B Gemmas (46 or
    62 layers) and 1/sqrt(head_dim) otherwise; a file's attention.scale, where present, wins."""
    if scale:
        return float(scale) ** -2
    if arch in ("gemma2", "gemma3") and n_layers in (46, 62):
        return float(hidden // heads)
    return None


def _positive(value: Any) -> float | None:
    return float(value) if value else None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _gguf_metadata(reader: Any) -> dict:
    meta = getattr(reader, "metadata", None)
    if isinstance(meta, dict):
        return meta
    fields = getattr(reader, "fields", None)  # gguf.GGUFReader
    if fields is None:
        raise TypeError(f"from_gguf needs an engine.model.gguf.file.GGUFFile or gguf.GGUFReader, "
                        f"got {type(reader).__name__}")
    big = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
    return {key: f.contents() for key, f in fields.items() if key not in big}


def _gguf_tensor_names(reader: Any) -> set[str]:
    return {t.name for t in reader.tensors}


def _check_vocabulary(meta: dict, reader: Any, tensors: set[str]) -> None:
    """llama.cpp sizes a model by its token list and refuses a token embedding of any other size: so do we
    (a token past the embedding's rows would fail mid-chat, a shorter list leaves rows no text reaches)."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None or "token_embd.weight" not in tensors:
        return
    rows = _gguf_embedding_rows(reader)
    if len(tokens) != rows:
        raise ValueError(f"vocabulary and embedding disagree: the vocabulary has {len(tokens):,} tokens, the token "
                         f"embedding (token_embd.weight) {rows:,} rows; the file is broken (llama.cpp refuses it too)")


def _gguf_embedding_rows(reader: Any) -> int:
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            # engine.model.gguf.file.GGUFFile lists shapes rows-first; gguf.GGUFReader in ggml order (rows last)
            return int(t.shape[0] if isinstance(getattr(reader, "metadata", None), dict) else t.shape[-1])
    raise ValueError("GGUF file has no vocab_size, token list or token_embd.weight to size the vocabulary")


def _gguf_small_tensor(reader: Any, name: str) -> list[float] | None:
    for t in reader.tensors:
        if t.name == name:
            if hasattr(reader, "tensor"):
                return reader.tensor(t.name, torch.float32).tolist()
            return [float(x) for x in t.data]
    return None


def attention_fuses(c: ModelConfig) -> bool:
    """Whether the CPU kernels' fused attention (kernels/cpu/attention.cpp) serves this architecture: it does
    every layer kind a config describes (q/k norms, partial rotary, sliding windows and their rope base,
    scaled rotary, soft-capped scores, sinks), given an even number of rotated dims no wider than the head."""
    return c.rotary_dims % 2 == 0 and 0 < c.rotary_dims <= c.head_dim


def decode_layers_fit(c: ModelConfig) -> bool:
    """Whether the CPU kernels' all-layers decode (kernels/cpu/decode.cpp) serves this architecture: SwiGLU or
    GeGLU MLPs, q/k norms, sandwich norms, sliding windows with their own rotary base, soft-capped scores
    allowed; not partial or scaled rotary (LongRoPE)."""
    return (c.hidden_act in ("silu", "gelu_tanh") and c.rope_attention_factor == 1.0
            and c.rotary_dims == c.head_dim)
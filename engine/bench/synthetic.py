"""Random-weight models built in memory for benchmarks (e.g. a Llama-3-8B-shaped model, no download).

Decode speed depends on shapes, not on weight values, so random weights measure the real thing.
"""
from __future__ import annotations

import torch

from ..model.config import ModelConfig
from ..model.loader import default_device, default_dtype
from ..model.model import Model
from ..model.tokenizer import Tokenizer
from ..model.tensor_names import tensor_shapes

# Layer shapes of real models (HF config.json fields): the synthetic models below, and tools.models.synthetic_gguf's
# random-weight GGUFs (which take the default tokenizer's vocabulary instead of the model's).
SHAPES: dict[str, dict] = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, rope_theta=500000.0),
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32,
                      head_dim=128, rope_theta=10000.0),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, rope_theta=100000.0),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                       head_dim=128, rope_theta=1000000.0),
}

# HF config.json fields of each synthetic model (shared by our ModelConfig and the transformers peer).
SYNTHETIC_MODELS: dict[str, dict] = {
    "llama3-8b-random": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, **SHAPES["llama3-8b"],
        "num_hidden_layers": 32, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
        "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001,
    },
    # The embedded default model's shapes: its speed on a machine that lacks the model's file (a bare GPU machine).
    "smollm2-135m-random": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 49152, **SHAPES["smollm2-135m"],
        "num_hidden_layers": 30, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    },
}

# Above this many parameters a synthetic model is a GPU benchmark: fp32 on a CPU would not fit or would crawl.
CPU_PARAMS_LIMIT = 2e9


def _config(name: str) -> dict:
    if name not in SYNTHETIC_MODELS:
        raise ValueError(f"unknown synthetic model {name!r}; known: {', '.join(SYNTHETIC_MODELS)}")
    return SYNTHETIC_MODELS[name]


def hf_config(name: str):
    """The transformers config of a synthetic model (for the peer)."""
    from transformers import AutoConfig

    cfg = dict(_config(name))
    return AutoConfig.for_model(cfg.pop("model_type"), **{k: v for k, v in cfg.items() if k != "architectures"})


def random_model(config: ModelConfig, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 seed: int = 0) -> Model:
    """A Model with N(0, 0.02) weights and unit norms, generated directly on the device."""
    dev = torch.device(device) if device is not None else default_device()
    dt = dtype if dtype is not None else default_dtype(dev)
    g = torch.Generator(device=dev).manual_seed(seed)
    weights = {}
    for name, shape in tensor_shapes(config).items():
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape, dtype=dt, device=dev)
        else:
            weights[name] = torch.empty(shape, dtype=dt, device=dev).normal_(0.0, 0.02, generator=g)
    return Model.from_state_dict(config, weights, dev, dt)


def placeholder_tokenizer(vocab_size: int) -> Tokenizer:
    """A word-level vocabulary `t0` .. `t{vocab_size - 1}` with `t2` as end of text. Random weights give tokens no
    meaning, so a synthetic model needs only ids that map to some text and one stop token, not a real
    vocabulary (nor the default model's file, which a bare GPU machine lacks)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel

    vocab = {f"t{i}": i for i in range(vocab_size)}
    return Tokenizer(HFTokenizer(WordLevel(vocab, unk_token="t0")), eos_token="t2", source="placeholder")


def synthetic_model(name: str, device: torch.device | str | None = None) -> Model:
    """One of SYNTHETIC_MODELS; refuses (clearly) where it can't run usefully: a large one needs CUDA's memory."""
    config = ModelConfig.from_hf(_config(name))
    dev = torch.device(device) if device is not None else default_device()
    dt = default_dtype(dev)
    params = sum(torch.Size(s).numel() for s in tensor_shapes(config).values())
    if dev.type != "cuda" and params > CPU_PARAMS_LIMIT:
        raise ValueError(f"{name} ({params / 1e9:.1f}B parameters, {params * 4 / 1e9:.0f} GB in fp32) is a GPU "
                         "benchmark: it needs a CUDA device and none is available here")
    model = random_model(config, dev, dt)
    model.name = name
    return model

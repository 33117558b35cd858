"""Tiny random-weight Hugging Face models written to disk by transformers, for peer tests.

Weights are drawn with a large spread (and random norm weights / biases) so logits are far from flat:
greedy comparisons then test the arithmetic rather than tie-breaking, and a wrong norm or bias shows.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

ARCHS = ("llama", "llama3", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "phi3-long")
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # small, so all three frequency bands occur
WEIGHT_STD = 0.25
WINDOW = 16  # sliding windows shorter than the test prompts, so they matter
GEMMAS = ("gemma", "gemma2", "gemma3")
MOE_ARCHS = ("qwen3moe", "mixtral")  # mixture of experts: 8 experts, 2 per token
# Per-arch shapes and features of the tiny models (query_pre_attn_scalar = head_dim, as llama.cpp assumes
# for every Gemma but the 27B ones, so the GGUF form computes the same thing).
_TINY = {
    "mistral": dict(sliding_window=WINDOW),
    "gemma2": dict(sliding_window=WINDOW, query_pre_attn_scalar=16, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0),
    # six layers: layer 5 is the first global one (five sliding, one global, as in the real models)
    "gemma3": dict(num_hidden_layers=6, sliding_window=WINDOW, query_pre_attn_scalar=16,
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}),
    # Phi-3.5/4-mini-like: LongRoPE past 64 tokens, half the head dims rotated, a sliding window
    # three layers, the middle one a dense MLP (mlp_only_layers), experts narrower than it
    "qwen3moe": dict(num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                     mlp_only_layers=[1], norm_topk_prob=True),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    "phi3-long": dict(max_position_embeddings=512, original_max_position_embeddings=64, partial_rotary_factor=0.5,
                      sliding_window=24),
}


def longrope_factors(n: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"rope_type": "longrope", "short_factor": (1 + torch.rand(n, generator=g)).tolist(),
            "long_factor": (1 + 8 * torch.rand(n, generator=g)).tolist()}


@lru_cache(maxsize=1)
def default_tokenizer():
    from engine.model.tokenizer import Tokenizer

    return Tokenizer.load()


def tiny_config(arch: str = "llama", *, rope_scaling: dict | None = None, tie: bool = True, **overrides):
    """The transformers config object of a tiny model of `arch` (built by transformers' own config class)."""
    import transformers

    vocab = overrides.get("vocab_size") or default_tokenizer().vocab_size
    kwargs = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=tie,
                  bos_token_id=1, eos_token_id=2, pad_token_id=2)
    kwargs.update(_TINY.get(arch, {}))
    if arch == "llama3":
        arch, rope_scaling = "llama", rope_scaling or LLAMA3_ROPE
    if arch == "phi3-long":
        arch, rope_scaling = "phi3", rope_scaling or longrope_factors(4)  # rotary dims 8: 4 frequencies
    classes = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
               "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
               "gemma": transformers.GemmaConfig, "gemma2": transformers.Gemma2Config,
               "gemma3": transformers.Gemma3TextConfig, "phi3": transformers.Phi3Config,
               "qwen3moe": transformers.Qwen3MoeConfig, "mixtral": transformers.MixtralConfig}
    if arch not in classes:
        raise ValueError(f"unknown tiny model arch {arch!r}; choose from {ARCHS + MOE_ARCHS}")
    if arch == "phi3":
        kwargs.pop("head_dim")  # Phi-3 has no head_dim field: hidden / heads = 16 anyway
    if rope_scaling is not None:
        kwargs["rope_scaling"] = dict(rope_scaling)
    kwargs.update(overrides)
    return classes[arch](**kwargs)


def write_tiny_model(folder: str | Path, arch: str = "llama", *, rope_scaling: dict | None = None, tie: bool = True,
                     sharded: bool = False, seed: int = 0, weight_std: float = WEIGHT_STD, tokenizer: bool = True,
                     **overrides) -> Path:
    """Write an HF model folder (config, safetensors, the default tokenizer unless `tokenizer` is False) and
    return its path. weight_std: the matrices' spread (wider models want a smaller one for the same gain per
    layer)."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    config = tiny_config(arch, rope_scaling=rope_scaling, tie=tie, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gemma = config.model_type.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma's norms scale by (1 + w): keep the effective scale near 1 too
                p.uniform_(-0.5, 0.5) if gemma else p.uniform_(0.5, 1.5)
            elif gemma and "embed_tokens" in name:  # Gemma multiplies embeddings by sqrt(hidden) = 8
                p.normal_(0.0, weight_std / 4)
            else:
                p.normal_(0.0, weight_std if p.dim() > 1 else 0.5)
    if tie:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="1MB" if sharded else "10GB")
    if tokenizer:
        default_tokenizer().save(folder)
    return folder


# ---------------------------------------------------------------- tiny GGUF files (llama.cpp conventions)

def gguf_name(hf: str, arch: str, n_layers: int) -> str:
    """llama.cpp's name for an HF tensor name, from the gguf package's own table (not engine.model.weights')."""
    import gguf

    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    name = gguf.get_tensor_name_map(arch_id, n_layers).get_name(hf, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise KeyError(f"gguf has no {arch} name for {hf}")
    return name


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


def write_tiny_gguf(hf_folder: str | Path, out: str | Path, qtype="F32", *, tokenizer=True) -> Path:
    """Convert a tiny HF folder to GGUF the way llama.cpp's convert_hf_to_gguf.py does: its tensor names,
    q/k rows permuted for llama, Gemma's norms stored as (1 + w), Phi-3's fused projections and LongRoPE
    factor tensors, its metadata keys; 2-D weights in qtype (a type name, or a function of the GGUF tensor
    name giving one, to mix types the way Q4_K_M does). K-quants are written by tools.ggml_writers (the
    gguf package cannot quantize to them). tokenizer: True for the default model's vocabulary, False for
    none, or a function that writes one into the gguf.GGUFWriter (add_spm_vocabulary, for a small one)."""
    import json
    import math

    import gguf
    import numpy as np
    from safetensors.torch import load_file

    hf_folder, out = Path(hf_folder), Path(out)
    cfg = json.loads((hf_folder / "config.json").read_text())
    files = sorted(hf_folder.glob("*.safetensors"))
    state = {k: v for f in files for k, v in load_file(f).items()}
    arch = {"mistral": "llama", "gemma3_text": "gemma3", "qwen3_moe": "qwen3moe"}.get(cfg["model_type"], cfg["model_type"])
    n_layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    rope = cfg.get("rope_parameters") or {}
    if arch == "gemma3":
        rope = rope["full_attention"]  # the global layers'; llama.cpp fixes the local base at 10000
    w = gguf.GGUFWriter(out, arch)
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    rot = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    if arch != "phi3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(rot)
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(head_dim, rope["rope_theta"], rope).numpy())
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch == "gemma3" and cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch in ("gemma2", "gemma3"):
        w.add_sliding_window(cfg["sliding_window"])
    if arch == "phi3":
        original = cfg.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        if rope.get("rope_type") == "longrope":
            scale = cfg["max_position_embeddings"] / original
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
            w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    if arch == "qwen3moe":  # every layer sparse (llama.cpp's layout), experts stacked into 3-D tensors
        experts = cfg.get("num_experts") or cfg["num_local_experts"]
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        pick = qtype if callable(qtype) else (lambda _name: qtype)
        for i in range(n_layers):
            for part, gguf_part in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
                stacked = [state.pop(f"model.layers.{i}.mlp.experts.{e}.{part}.weight") for e in range(experts)]
                name = f"blk.{i}.ffn_{gguf_part}_exps.weight"
                quant = gguf.GGMLQuantizationType[pick(name)]
                if quant == gguf.GGMLQuantizationType.F32:
                    w.add_tensor(name, torch.stack(stacked).float().numpy())
                else:  # experts outermost: each expert's blocks one contiguous range, as llama.cpp writes them
                    from tools.ggml_writers import quantize as quantize_ggml

                    w.add_tensor(name, np.stack([quantize_ggml(x, quant) for x in stacked]), raw_dtype=quant)
    if callable(tokenizer):
        tokenizer(w)
    elif tokenizer:
        from tools.models.synthetic_gguf import copy_default_tokenizer

        copy_default_tokenizer(w)
    pick = qtype if callable(qtype) else (lambda _name: qtype)
    for name, t in state.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        t = t.float()
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            t = t + 1
        if arch == "llama" and "q_proj" in name:
            t = llama_cpp_permute(t, heads)
        elif arch == "llama" and "k_proj" in name:
            t = llama_cpp_permute(t, kv_heads)
        target = gguf_name(name, arch, n_layers)
        quant = gguf.GGMLQuantizationType[pick(target)]
        if t.dim() == 2 and quant != gguf.GGMLQuantizationType.F32:
            from tools.ggml_writers import quantize as quantize_ggml

            w.add_tensor(target, quantize_ggml(t, quant), raw_dtype=quant)
        else:
            w.add_tensor(target, np.ascontiguousarray(t.numpy()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# Shapes whose rows are whole K-quant super-blocks (256), for GGUFs of every ggml type.
WIDE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)


def write_wide_gguf(folder: str | Path, arch: str = "llama", *, seed: int = 0, tie: bool = True,
                    weight_std: float = WEIGHT_STD / 2) -> Path:
    """A tiny random model of `arch` (tests.tiny_models.ARCHS) as an F32 GGUF in llama.cpp's layout, every
    row a multiple of 256 wide (WIDE) and a small SentencePiece vocabulary (add_spm_vocabulary), so it
    quantizes to any ggml type and loads in pagedeck and llama.cpp alike. Gemmas get
    query_pre_attn_scalar = head_dim (llama.cpp's assumption); LongRoPE factors cover the rotated dims;
    Phi-3 has no sliding window (llama.cpp disables it). weight_std: half the 64-wide models' (rows 4x
    longer), so each layer amplifies about as much."""
    folder = Path(folder)
    vocab = len(spm_vocabulary("llama")[0])
    extra = dict(WIDE)
    if arch.startswith("phi3"):
        extra.pop("head_dim")  # Phi-3 has none: hidden / heads = 64
    if arch in ("gemma2", "gemma3"):
        extra["query_pre_attn_scalar"] = WIDE["head_dim"]
    if arch.startswith("phi3"):
        extra["sliding_window"] = None  # llama.cpp ignores Phi-3's window ("Phi SWA is currently disabled")
    if arch == "phi3-long":
        extra["rope_scaling"] = longrope_factors(WIDE["head_dim"] // 4)  # half of 64 dims rotated: 16 frequencies
    hf = write_tiny_model(folder / f"{arch}-hf", arch, tie=tie, seed=seed, vocab_size=vocab, weight_std=weight_std,
                          **extra)
    return write_tiny_gguf(hf, folder / f"{arch}-F32.gguf", "F32", tokenizer=add_spm_vocabulary)


def q4_k_m(name: str) -> str:
    """llama.cpp's Q4_K_M recipe for a 2-layer model (tools.models.synthetic_gguf owns the rule)."""
    from tools.models.synthetic_gguf import q4_k_m_type

    return q4_k_m_type(name, 2)


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


# ---------------------------------------------------------------- a tiny SentencePiece GGUF vocabulary

SPM_CORPUS = ("the quick brown fox jumps over the lazy dog . hello world , the weather in paris is sunny today "
              "models people already have on their disks : gemma phi llama qwen . 1234 numbers 42 and more text "
              "The Quick Brown Fox ! Hello World ? it's a test of the tokenizer with repeated words words words")
SPM_SPECIALS = {"gemma2": ["<start_of_turn>", "<end_of_turn>"], "phi3": ["<|user|>", "<|assistant|>", "<|end|>"],
                "llama": []}


def spm_vocabulary(arch: str = "llama", merges: int = 150) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a SentencePiece ("llama") vocabulary the way llama.cpp writes one:
    <unk> <s> </s>, 256 byte-fallback tokens, single characters, then pieces learned by a few BPE merges
    over a small corpus (scores falling with merge order), the arch's chat control tokens, and for Gemma
    whitespace-run tokens stored with real spaces, user-defined (matched in the raw text, as
    SentencePiece and llama.cpp match them)."""
    import collections

    words = collections.Counter("\u2581" + w for w in SPM_CORPUS.split())
    pieces = {w: list(w) for w in words}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for ch in sorted({c for w in words for c in w} | {"\n"}):
        tokens.append(ch)
        types.append(1)
        scores.append(-1000.0)
    for step in range(merges):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(pieces[w], pieces[w][1:]):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        for w in words:
            p, out, i = pieces[w], [], 0
            while i < len(p):
                if i + 1 < len(p) and p[i] == a and p[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(p[i])
                    i += 1
            pieces[w] = out
        tokens.append(a + b)
        types.append(1)
        scores.append(-float(step))
    if arch.startswith("gemma"):
        for n in (2, 3, 4):  # Gemma keeps runs of spaces as user-defined tokens, real spaces in its GGUFs
            tokens.append(" " * n)
            types.append(4)
            scores.append(-float(merges + n))
    for special in SPM_SPECIALS.get(arch, []):
        tokens.append(special)
        types.append(3)
        scores.append(0.0)
    return tokens, scores, types


def add_spm_vocabulary(w, arch: str = "llama", merges: int = 150) -> int:
    """Write spm_vocabulary(arch, merges) into a GGUFWriter (BOS 1, EOS 2, UNK 0); returns its size."""
    tokens, scores, types = spm_vocabulary(arch, merges)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    return len(tokens)


def write_tiny_spm_gguf(path: str | Path, arch: str = "llama", merges: int = 150) -> Path:
    """A GGUF holding only a SentencePiece vocabulary (spm_vocabulary)."""
    import gguf

    w = gguf.GGUFWriter(path, arch)
    add_spm_vocabulary(w, arch, merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)

"""Random-weight GGUFs quantized by llama.cpp itself: a model's tensors written F16 (or BF16) one at a time,
then llama.cpp's quantizer (llama-cpp-python's llama_model_quantize, the peers extra) applies its own
per-layer recipe, so a Q4_K_M file holds the mix a real one does (Q6_K attn_v / ffn_down in the layers its
use_more_bits rule picks, a Q6_K head, K-quant fallbacks on rows that are no multiple of 256).
`python -m tools.models.synthetic_gguf OUT.gguf --preset qwen2.5-1.5b --quantize Q4_K_M` is the command.

The F16 source is streamed: each matrix is generated a slab of rows at a time and written straight to the
file, so a 3B-shaped model never sits in memory, and the source is deleted once quantized. Presets carry
what llama.cpp's architecture needs from a real file: Qwen 2's q/k/v biases, Gemma 3's q/k norms, sandwich
norms and 512-token sliding window (llama.cpp fixes its five-local-one-global pattern and local rope base;
pagedeck reads the same defaults), Llama 3's rope_freqs factors, gpt-oss's attention sinks, biases (q/k/v/o,
router, experts) and YaRN keys. gpt-oss quantizes with MXFP4_MOE, the recipe of the published gpt-oss GGUFs:
every expert stack MXFP4, every other matrix Q8_0 but the router (llama.cpp never quantizes it), biases,
sinks and norms F32.
"""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

# ftype names --quantize takes (llama.cpp's LLAMA_FTYPE_MOSTLY_<name>)
QUANTIZE_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS", "Q4_K_S", "Q5_K_S", "Q4_0", "Q3_K_M", "Q2_K", "MXFP4_MOE")
SOURCE_TYPES = ("F16", "BF16")
ARCHS = ("llama", "qwen2", "gemma3", "qwen3moe", "gpt-oss")

# Real models' text configurations (their config.json values). tokenizer: tools.models.synthetic_gguf's kinds.
PRESETS: dict[str, dict] = {
    # Qwen2.5-1.5B's config.json ties the head to the embedding (its 7B and bigger siblings do not)
    "qwen2.5-1.5b": dict(arch="qwen2", layers=28, hidden_size=1536, intermediate_size=8960, num_attention_heads=12,
                         num_key_value_heads=2, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         context_length=32768, vocab=151936, tokenizer="bpe", pre="qwen2", tied=True),
    "gemma3-270m": dict(arch="gemma3", layers=18, hidden_size=640, intermediate_size=2048, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=256, rope_theta=1000000.0, rms_norm_eps=1e-6,
                        context_length=32768, vocab=262144, tokenizer="spm", tied=True, sliding_window=512),
    "llama3.2-3b": dict(arch="llama", layers=28, hidden_size=3072, intermediate_size=8192, num_attention_heads=24,
                        num_key_value_heads=8, head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-5,
                        context_length=131072, vocab=128256, tokenizer="bpe", pre="llama-bpe", tied=True,
                        rope_scaling=dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=8192)),
    # Qwen3-30B-A3B: 48 sparse layers of 128 experts (8 a token, 768 wide, renormalised top-k weights), Qwen 3's
    # q/k norms, an untied head
    "qwen3-30b-a3b": dict(arch="qwen3moe", layers=48, hidden_size=2048, intermediate_size=6144,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, rope_theta=1000000.0,
                          rms_norm_eps=1e-6, context_length=40960, vocab=151936, tokenizer="bpe", pre="qwen2",
                          tied=False, num_experts=128, experts_per_token=8, moe_intermediate_size=768),
    # gpt-oss-20b: 24 layers of 32 experts (4 a token, 2880 wide, biased, clamped SwiGLU: llama.cpp's code fixes
    # the routing and clamp), sliding (128) and full attention alternating (llama.cpp's fixed pattern), 64 query
    # and 8 K/V heads of 64 with biases and sinks, YaRN x32 over 4096 positions, o200k_harmony's 201,088 tokens
    # and gpt-4o pre-tokenizer, an untied head
    "gpt-oss-20b": dict(arch="gpt-oss", layers=24, hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                        num_key_value_heads=8, head_dim=64, rope_theta=150000.0, rms_norm_eps=1e-5,
                        context_length=131072, vocab=201088, tokenizer="bpe", pre="gpt-4o", specials="harmony",
                        tied=False, num_experts=32, experts_per_token=4, moe_intermediate_size=2880,
                        sliding_window=128,
                        rope_scaling=dict(rope_type="yarn", factor=32.0, original_max_position_embeddings=4096)),
}
_SLAB_ELEMENTS = 1 << 24  # rows generated at a time: ~64 MB of float32


def llama3_rope_freqs(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter writes it for Llama 3 scaling: the divisor of each frequency
    (1 for short wavelengths, `factor` for long ones, a smooth blend between)."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen, old = 2 * math.pi / inv, scaling["original_max_position_embeddings"]
    lo, hi, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
    smooth = np.clip((old / wavelen - lo) / (hi - lo), 0.0, 1.0)
    return (1.0 / ((1 - smooth) / factor + smooth)).astype(np.float32)


def tensor_specs(p: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape) of every tensor of the model `p` (a PRESETS entry), in convert_hf_to_gguf's
    order: the embedding, each block, the final norm, the head unless tied."""
    h, inter, hd = p["hidden_size"], p["intermediate_size"], p["head_dim"]
    q, kv = p["num_attention_heads"] * hd, p["num_key_value_heads"] * hd
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (p["vocab"], h))]
    if _llama3_scaling(p):
        out.append(("rope_freqs.weight", (hd // 2,)))
    for i in range(p["layers"]):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (q, h)), (b + "attn_k.weight", (kv, h)),
                (b + "attn_v.weight", (kv, h)), (b + "attn_output.weight", (h, q))]
        if p["arch"] in ("qwen2", "gpt-oss"):
            out += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)), (b + "attn_v.bias", (kv,))]
        if p["arch"] == "gpt-oss":  # the output projection's bias, one sink logit per query head, the MLP's norm
            out += [(b + "attn_output.bias", (h,)), (b + "attn_sinks.weight", (p["num_attention_heads"],)),
                    (b + "post_attention_norm.weight", (h,))]
            e, mi = p["num_experts"], p["moe_intermediate_size"]
            out += [(b + "ffn_gate_inp.weight", (e, h)), (b + "ffn_gate_inp.bias", (e,)),
                    (b + "ffn_gate_exps.weight", (e, mi, h)), (b + "ffn_gate_exps.bias", (e, mi)),
                    (b + "ffn_up_exps.weight", (e, mi, h)), (b + "ffn_up_exps.bias", (e, mi)),
                    (b + "ffn_down_exps.weight", (e, h, mi)), (b + "ffn_down_exps.bias", (e, h))]
            continue
        if p["arch"] in ("gemma3", "qwen3moe"):
            out += [(b + "attn_q_norm.weight", (hd,)), (b + "attn_k_norm.weight", (hd,))]
        if p["arch"] == "gemma3":
            out += [(b + "post_attention_norm.weight", (h,)), (b + "post_ffw_norm.weight", (h,))]
        out.append((b + "ffn_norm.weight", (h,)))
        if p["arch"] == "qwen3moe":  # the router, then the experts stacked (experts, rows, cols) as llama.cpp has them
            e, mi = p["num_experts"], p["moe_intermediate_size"]
            out += [(b + "ffn_gate_inp.weight", (e, h)), (b + "ffn_gate_exps.weight", (e, mi, h)),
                    (b + "ffn_up_exps.weight", (e, mi, h)), (b + "ffn_down_exps.weight", (e, h, mi))]
        else:
            out += [(b + "ffn_gate.weight", (inter, h)), (b + "ffn_up.weight", (inter, h)),
                    (b + "ffn_down.weight", (h, inter))]
    out.append(("output_norm.weight", (h,)))
    if not p["tied"]:
        out.append(("output.weight", (p["vocab"], h)))
    return out


def _llama3_scaling(p: dict) -> bool:
    """Llama 3's rope scaling (a rope_freqs tensor), rather than YaRN's (keys only)."""
    return bool(p.get("rope_scaling")) and p["rope_scaling"].get("rope_type", "llama3") == "llama3"


_METADATA = (  # GGUFWriter setter, the model field it writes (llama.cpp's {arch}.* keys)
    ("add_block_count", "layers"), ("add_context_length", "context_length"), ("add_embedding_length", "hidden_size"),
    ("add_feed_forward_length", "intermediate_size"), ("add_head_count", "num_attention_heads"),
    ("add_head_count_kv", "num_key_value_heads"), ("add_key_length", "head_dim"), ("add_value_length", "head_dim"),
    ("add_rope_dimension_count", "head_dim"), ("add_rope_freq_base", "rope_theta"),
    ("add_layer_norm_rms_eps", "rms_norm_eps"), ("add_vocab_size", "vocab"))


def _add_metadata(w, p: dict, name: str, seed: int, chat_template: str | None, add_tokenizer) -> None:
    from tools.models import _synthetic_vocab as synthetic_vocab

    w.add_name(name)
    for setter, key in _METADATA:
        getattr(w, setter)(p[key])
    if p.get("sliding_window"):
        w.add_sliding_window(p["sliding_window"])
    if p.get("num_experts"):
        w.add_expert_count(p["num_experts"])
        w.add_expert_used_count(p["experts_per_token"])
        w.add_expert_feed_forward_length(p["moe_intermediate_size"])
    if p.get("rope_scaling") and not _llama3_scaling(p):  # YaRN, as convert_hf_to_gguf writes gpt-oss's
        import gguf

        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(p["rope_scaling"]["factor"])
        w.add_rope_scaling_orig_ctx_len(p["rope_scaling"]["original_max_position_embeddings"])
    if p["tokenizer"] == "bpe":
        synthetic_vocab.add_bpe_vocabulary(w, p["vocab"], seed=seed, pre=p.get("pre", "qwen2"),
                                           specials=p.get("specials", "qwen"))
    elif p["tokenizer"] == "spm":
        synthetic_vocab.add_spm_vocabulary(w, p["vocab"], seed=seed)
    elif add_tokenizer is not None:
        add_tokenizer(w)
    else:
        raise ValueError(f"tokenizer {p['tokenizer']!r} needs add_tokenizer (a function writing it into the file)")
    if chat_template:
        w.add_chat_template(chat_template)


def _write_matrix(fout, shape: tuple[int, int], g: torch.Generator, dtype: torch.dtype, std: float) -> None:
    rows, cols = shape
    step = max(1, _SLAB_ELEMENTS // cols)
    for r in range(0, rows, step):
        slab = (torch.randn((min(step, rows - r), cols), generator=g) * std).to(dtype)
        (slab.view(torch.int16) if dtype == torch.bfloat16 else slab).numpy().tofile(fout)


def write_source_gguf(out: str | Path, p: dict, *, source_type: str = "F16", seed: int = 0,
                      name: str = "random model", chat_template: str | None = None, std: float = 0.02,
                      add_tokenizer: Callable | None = None) -> Path:
    """Write the model `p` (a PRESETS entry, or one like it) as a GGUF of N(0, std) matrices in `source_type`
    (F16 or BF16), N(0, std) F32 biases and unit F32 norms, streamed: the header first, then each matrix a slab of
    rows at a time, so memory stays at one slab whatever the model's size; gpt-oss's sinks N(1, 1) (a real
    share of each softmax, a different one per head) and its expert biases F32 stacks. The default std is a trained
    model's typical one (speed does not depend on it); a bigger one spreads a tiny model's logits, which
    comparisons want. The vocabulary: p["tokenizer"] "bpe" or "spm" (tools.models._synthetic_vocab's real-size
    ones), any other through add_tokenizer(writer) (synthetic_gguf's SmolLM2 one)."""
    import gguf

    if p["arch"] not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {p['arch']!r}")
    if source_type not in SOURCE_TYPES:
        raise ValueError(f"source type must be one of {SOURCE_TYPES}, got {source_type!r}")
    qtype = gguf.GGMLQuantizationType[source_type]
    dtype = torch.float16 if source_type == "F16" else torch.bfloat16
    specs = tensor_specs(p)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(out, p["arch"])
    _add_metadata(w, p, name, seed, chat_template, add_tokenizer)
    for tname, shape in specs:
        if len(shape) == 1 or tname.endswith(".bias"):
            w.add_tensor_info(tname, shape, np.dtype(np.float32), 4 * math.prod(shape))
        else:
            w.add_tensor_info(tname, shape, np.dtype(np.float16), 2 * math.prod(shape), raw_dtype=qtype)
    w.write_header_to_file(out)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    g = torch.Generator().manual_seed(seed)
    for tname, shape in specs:
        w.write_padding(fout, fout.tell())
        start = fout.tell()
        if tname == "rope_freqs.weight":
            llama3_rope_freqs(p["head_dim"], p["rope_theta"], p["rope_scaling"]).tofile(fout)
        elif tname.endswith(".bias"):
            (torch.randn(shape, generator=g) * std).numpy().tofile(fout)
        elif tname.endswith("attn_sinks.weight"):
            (torch.randn(shape, generator=g) + 1).numpy().tofile(fout)
        elif len(shape) == 1:
            np.ones(shape, dtype=np.float32).tofile(fout)
        else:  # a matrix, or a stack of them (experts) as its rows one after another
            _write_matrix(fout, (math.prod(shape[:-1]), shape[-1]), g, dtype, std)
        w.write_padding(fout, fout.tell() - start)
    w.close()
    return out


class QuantizeError(RuntimeError):
    """llama.cpp's quantizer refused a file; the message carries the reason it logged."""


def quantize(src: str | Path, dst: str | Path, ftype: str = "Q4_K_M", threads: int | None = None) -> Path:
    """llama.cpp's own quantizer and recipe (`llama-quantize SRC DST ftype`), in this process. No importance
    matrix is given: a type that needs one is refused with llama.cpp's reason (QuantizeError)."""
    import llama_cpp

    if ftype not in QUANTIZE_TYPES:
        raise ValueError(f"--quantize must be one of {', '.join(QUANTIZE_TYPES)}, got {ftype!r}")
    logged: list[str] = []
    keep = llama_cpp.llama_log_callback(lambda level, text, user: logged.append(text.decode("utf-8", "replace")))
    llama_cpp.llama_log_set(keep, ctypes.c_void_p())
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
        params.nthread = threads or os.cpu_count() or 1
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    finally:
        llama_cpp.llama_log_set(llama_cpp.llama_log_callback(0), ctypes.c_void_p())
    if rc != 0:
        Path(dst).unlink(missing_ok=True)
        reason = [line.strip() for line in "".join(logged).splitlines() if "error" in line.lower() or "fail" in line]
        raise QuantizeError(f"llama.cpp's quantizer refused {ftype} for {src} (code {rc}): "
                            + ("; ".join(reason[-3:]) or "no reason logged"))
    return Path(dst)


def write_quantized_gguf(out: str | Path, p: dict, ftype: str = "Q4_K_M", *, source_type: str = "F16",
                         seed: int = 0, name: str | None = None, chat_template: str | None = None,
                         keep_source: bool = False, threads: int | None = None, std: float = 0.02,
                         add_tokenizer: Callable | None = None) -> Path:
    """The model `p` with random weights, quantized to `ftype` by llama.cpp: the F16/BF16 source is written
    beside `out` (OUT.F16.gguf or OUT.BF16.gguf) and deleted afterwards unless keep_source; std and
    add_tokenizer as write_source_gguf."""
    out = Path(out)
    source = out.with_name(f"{out.stem}.{source_type}.gguf")
    name = name or f"random {p['arch']} ({p['layers']} layers, {ftype} by llama.cpp)"
    try:
        write_source_gguf(source, p, source_type=source_type, seed=seed, name=name, chat_template=chat_template,
                          std=std, add_tokenizer=add_tokenizer)
        return quantize(source, out, ftype, threads)
    finally:
        if not keep_source:
            source.unlink(missing_ok=True)


def tensor_types(path: str | Path) -> dict[str, str]:
    """{tensor name: ggml type name} of a GGUF file, read by gguf-py's reader."""
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def type_mix(types: dict[str, str]) -> list[str]:
    """One line per tensor kind: each type it is stored in and the layers that have it, e.g.
    "attn_v.weight: Q6_K in blk 0,1,2,5 | Q4_K in blk 3,4" (what shows a recipe's per-layer mix)."""
    kinds: dict[str, dict[str, list[str]]] = {}
    for name, qtype in types.items():
        parts = name.split(".")
        kind, where = (".".join(parts[2:]), parts[1]) if parts[0] == "blk" else (name, "")
        kinds.setdefault(kind, {}).setdefault(qtype, []).append(where)
    lines = []
    for kind, by_type in kinds.items():
        cells = [f"{q} in blk {','.join(ws)}" if ws[0] else q for q, ws in by_type.items()]
        lines.append(f"{kind}: {' | '.join(cells)}")
    return lines

"""Random-weight GGUF files with real model shapes and llama.cpp's quantization recipes, for benchmarks:
`python -m tools.synthetic_gguf OUT.gguf --shape llama3-8b --layers 4 --quant Q4_K_M`.

Decode speed depends on shapes and formats, not on weight values, so a 7B-shaped Q4_K_M file with a few
of its layers measures per-layer cost and memory honestly (the roofline scales with the layer count). The
vocabulary is the embedded SmolLM2 tokenizer's (49,152 tokens), so the file loads and tokenizes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from engine.bench.synthetic import SHAPES
from engine.model.weights import GGUFFile, default_model_path
from tools.ggml_writers import quantize


def copy_default_tokenizer(w, meta: dict | None = None) -> None:
    """Write the embedded SmolLM2 tokenizer (vocabulary, merges, special ids, chat template) into a GGUFWriter."""
    meta = meta or GGUFFile(default_model_path()).metadata
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    w.add_chat_template(meta["tokenizer.chat_template"])


def q4_k_m_type(name: str, n_layers: int) -> str:
    """llama.cpp's Q4_K_M choice for a tensor: Q6_K for the output head and for attn_v / ffn_down of the
    layers its use_more_bits rule picks (the first and last eighth, every third in between), Q4_K else."""
    if name == "output.weight":
        return "Q6_K"
    if name.startswith("blk.") and name.endswith(("attn_v.weight", "ffn_down.weight")):
        i = int(name.split(".")[1])
        if i < n_layers // 8 or i >= 7 * n_layers // 8 or (i - n_layers // 8) % 3 == 2:
            return "Q6_K"
    return "Q4_K"


def write_random_gguf(out: str | Path, shape: str = "llama3-8b", layers: int = 4, quant: str = "Q4_K_M",
                      seed: int = 0) -> Path:
    """Write a llama-architecture GGUF of `layers` random layers of `shape`, quantized by `quant` (a ggml
    type name or Q4_K_M); tensors are generated and quantized one at a time."""
    import gguf

    s = SHAPES[shape]
    meta = GGUFFile(default_model_path()).metadata
    vocab = len(meta["tokenizer.ggml.tokens"])
    h, inter, heads, kv, hd = (s["hidden_size"], s["intermediate_size"], s["num_attention_heads"],
                               s["num_key_value_heads"], s["head_dim"])
    w = gguf.GGUFWriter(out, "llama")
    w.add_name(f"random {shape} ({layers} layers, {quant})")
    w.add_block_count(layers)
    w.add_context_length(8192)
    w.add_embedding_length(h)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    if quant == "Q4_K_M":
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    copy_default_tokenizer(w, meta)
    g = torch.Generator().manual_seed(seed)
    shapes = {"token_embd.weight": (vocab, h), "output_norm.weight": (h,), "output.weight": (vocab, h)}
    for i in range(layers):
        shapes.update({f"blk.{i}.attn_q.weight": (heads * hd, h), f"blk.{i}.attn_k.weight": (kv * hd, h),
                       f"blk.{i}.attn_v.weight": (kv * hd, h), f"blk.{i}.attn_output.weight": (h, heads * hd),
                       f"blk.{i}.ffn_gate.weight": (inter, h), f"blk.{i}.ffn_up.weight": (inter, h),
                       f"blk.{i}.ffn_down.weight": (h, inter), f"blk.{i}.attn_norm.weight": (h,),
                       f"blk.{i}.ffn_norm.weight": (h,)})
    for name, shp in shapes.items():
        if len(shp) == 1:
            w.add_tensor(name, np.ones(shp, dtype=np.float32))
            continue
        t = torch.randn(shp, generator=g) * 0.02
        qtype = gguf.GGMLQuantizationType[q4_k_m_type(name, layers) if quant == "Q4_K_M" else quant]
        w.add_tensor(name, quantize(t, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--quant", default="Q4_K_M", help="Q4_K_M or a ggml type name (Q4_K, Q8_0, ...)")
    args = ap.parse_args(argv)
    path = write_random_gguf(args.out, args.shape, args.layers, args.quant)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

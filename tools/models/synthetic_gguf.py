"""Random-weight GGUF files with real model shapes and llama.cpp's quantization recipes, for benchmarks:
`python -m tools.models.synthetic_gguf OUT.gguf --shape llama3-8b --layers 4 --quant Q4_K_M`.

Decode speed depends on shapes and formats, not on weight values, so a 7B-shaped Q4_K_M file with a few
of its layers measures per-layer cost and memory honestly (the roofline scales with the layer count). The
vocabulary is the embedded SmolLM2 tokenizer's (49,152 tokens), so the file loads and tokenizes; or, with
--tokenizer bpe / spm, a real-size one (tools.models._synthetic_vocab: Qwen 2.5's 151,936-token byte-level BPE, Gemma
3's 262,144-piece SentencePiece), so the header costs what a real file's does.

`--quantize Q4_K_M` (Q5_K_M, Q6_K, Q8_0, IQ4_XS, ...) hands the quantizing to llama.cpp instead
(tools.models._llamacpp_quantized): an F16 file streamed to disk, then llama.cpp's own quantizer and per-layer
recipe, for a `--preset` (qwen2.5-1.5b, gemma3-270m, llama3.2-3b, qwen3-30b-a3b, gpt-oss-20b: architecture,
shapes, layers, vocabulary and head of the real model; gpt-oss-20b with `--quantize MXFP4_MOE`, the recipe of
the published gpt-oss files) or an `--arch` of a `--shape`. Without it, our own writers quantize (tools.ggml_writers),
one type per tensor kind following a copy of llama.cpp's Q4_K_M rule for llama tensors.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from engine.bench.synthetic import SHAPES as BENCH_SHAPES
from engine.model.gguf.file import GGUFFile
from engine.model.weights import default_model_path
from tools.ggml_writers import quantize


# A tiny shape (tests: a model that loads in a moment) beside the benchmarks' real ones.
SHAPES = {**BENCH_SHAPES, "tiny": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, rope_theta=10000.0),
          # Gemma 3 270M's layer shapes (its 18 layers, 262k vocabulary and tied head via --layers 18
          # --vocab 262144 --tied); the tensors stay llama's. Its 640-wide rows are no multiple of 256, so
          # the Q4_K_M recipe falls back as llama.cpp's does (k_quant_fallback): Q5_0 / Q8_0 there.
          "gemma3-270m": dict(hidden_size=640, intermediate_size=2048, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=256, rope_theta=1000000.0),
          # Llama 3.2 3B (28 layers, a 128,256-token vocabulary and a tied head: --layers 28 --vocab 128256
          # --tied, as `make bench-big` builds it)
          "llama3.2-3b": dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=24,
                              num_key_value_heads=8, head_dim=128, rope_theta=500000.0),
          # a tiny shape whose rows are 256 wide: the K-quants themselves, no fallback (tests of the Q4_K_M
          # recipe's mixed and all-Q4_K fused groups)
          "tiny-256": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=64, rope_theta=10000.0)}
TOKENIZERS = ("smollm2", "bpe", "spm")
_REAL_SIZES = {"bpe": 151_936, "spm": 262_144}  # Qwen 2.5's and Gemma 3's vocabularies
_CONTROL = 3  # llama.cpp's token type of special (control) tokens
_UNUSED = 5  # llama.cpp's token type of unused (padding) tokens
# llama.cpp's replacement for a K-quant on rows whose length is no multiple of its 256-weight super-block
_K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_1"}


def k_quant_fallback(qtype: str, row_length: int) -> str:
    """The type llama.cpp writes for `qtype` on rows of `row_length` weights (itself where it fits)."""
    return _K_FALLBACK.get(qtype, qtype) if row_length % 256 else qtype


EOS_ID = 16  # the last of SmolLM2's 17 special tokens: family vocabularies put their EOS there


def family_vocabulary(tokens: list[str], chat_tokens: tuple[str, ...], bos: str | None = None,
                      eos: str | None = None) -> list[str]:
    """The default vocabulary dressed as another model family's: its special tokens from id 1 on (ChatML's
    <|im_start|>, <|im_end|>, then spare ones) renamed to `chat_tokens`, id 0 to `bos` and id EOS_ID to
    `eos` when given. With no chat_tokens, ChatML's two are renamed to reserved names: a base model's
    vocabulary, no chat turns at all. The size stays the same, so the weights still fit."""
    out = list(tokens)
    renamed = chat_tokens or ("<|reserved_special_0|>", "<|reserved_special_1|>")
    for i, text in enumerate(renamed, start=1):
        out[i] = text
    if bos is not None:
        out[0] = bos
    if eos is not None:
        out[EOS_ID] = eos
    return out


def copy_default_tokenizer(w, meta: dict | None = None, *, chat_template: str | bool = True,
                           chat_tokens: tuple[str, ...] | None = None, bos: str | None = None,
                           eos: str | None = None, pad_to: int | None = None) -> None:
    """Write the embedded SmolLM2 tokenizer (vocabulary, merges, special ids, chat template) into a GGUFWriter.

    chat_template: True keeps SmolLM2's, False writes none, a string writes that one. chat_tokens: write
    family_vocabulary(chat_tokens, bos, eos) instead of SmolLM2's own (BOS token 0, EOS token 0 or EOS_ID).
    pad_to: a bigger vocabulary, SmolLM2's followed by unused "<unused_N>" tokens up to this many."""
    meta = meta or GGUFFile(default_model_path()).metadata
    tokens = meta["tokenizer.ggml.tokens"]
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    if meta.get("tokenizer.ggml.pre"):
        w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    extra = max(0, (pad_to or 0) - len(tokens))
    if chat_tokens is None:
        w.add_token_list(list(tokens) + [f"<unused_{i}>" for i in range(extra)])
        w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
        w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    else:
        w.add_token_list(family_vocabulary(tokens, chat_tokens, bos, eos) + [f"<unused_{i}>" for i in range(extra)])
        w.add_bos_token_id(0)
        w.add_eos_token_id(0 if eos is None else EOS_ID)
    types = list(meta["tokenizer.ggml.token_type"])
    for i in range(1, 1 + len(chat_tokens or ())):
        types[i] = _CONTROL
    w.add_token_types(types + [_UNUSED] * extra)
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    if chat_template is True:
        w.add_chat_template(meta["tokenizer.chat_template"])
    elif chat_template:
        w.add_chat_template(chat_template)


def _add_real_size_tokenizer(w, kind: str, size: int, seed: int, pre: str | None) -> None:
    from tools.models import _synthetic_vocab as synthetic_vocab

    if kind == "bpe":
        synthetic_vocab.add_bpe_vocabulary(w, size, seed=seed, pre=pre or "qwen2")
    else:
        synthetic_vocab.add_spm_vocabulary(w, size, seed=seed)


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
                      seed: int = 0, *, arch: str = "llama", chat_template: str | bool = True,
                      chat_tokens: tuple[str, ...] | None = None, bos: str | None = None, eos: str | None = None,
                      vocab: int | None = None,
                      split_max_tensors: int = 0, pad_vocab: bool = False, tied: bool = False,
                      pre: str | None = None, tokenizer: str = "smollm2") -> Path:
    """Write a llama-architecture GGUF of `layers` random layers of `shape`, quantized by `quant` (a ggml
    type name or Q4_K_M); tensors are generated and quantized one at a time.

    arch names general.architecture (the tensors stay llama's); chat_template / chat_tokens / bos / eos as
    copy_default_tokenizer; vocab: the embedding's rows (default: the vocabulary's size; another number
    makes a file whose vocabulary and embedding disagree, unless pad_vocab pads the vocabulary with unused
    tokens to it); tied: no output.weight, the token embedding is the head (and takes the head's type in the
    Q4_K_M recipe); K-quants on rows that are no multiple of 256 fall back as llama.cpp's (k_quant_fallback);
    pre: another tokenizer.ggml.pre ("" writes none); split_max_tensors > 0 writes a split set
    (name-00001-of-0000N.gguf ..., llama.cpp's gguf-split layout) and returns its first file. tokenizer:
    "smollm2" (the embedded vocabulary, as above), "bpe" or "spm" (tools.models._synthetic_vocab's real-size ones,
    `vocab` tokens: default 151,936 / 262,144; chat_template as above, SmolLM2's ChatML one for True)."""
    import gguf

    s = SHAPES[shape]
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
    meta = GGUFFile(default_model_path()).metadata
    if pre is not None:
        meta = {**meta, "tokenizer.ggml.pre": pre}
    vocab = vocab or (len(meta["tokenizer.ggml.tokens"]) if tokenizer == "smollm2" else _REAL_SIZES[tokenizer])
    h, inter, heads, kv, hd = (s["hidden_size"], s["intermediate_size"], s["num_attention_heads"],
                               s["num_key_value_heads"], s["head_dim"])
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(out, arch, split_max_tensors=split_max_tensors)
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
    if tokenizer == "smollm2":
        copy_default_tokenizer(w, meta, chat_template=chat_template, chat_tokens=chat_tokens, bos=bos, eos=eos,
                               pad_to=vocab if pad_vocab else None)
    else:
        _add_real_size_tokenizer(w, tokenizer, vocab, seed, pre)
        if chat_template:
            w.add_chat_template(meta["tokenizer.chat_template"] if chat_template is True else chat_template)
    g = torch.Generator().manual_seed(seed)
    shapes = {"token_embd.weight": (vocab, h), "output_norm.weight": (h,), "output.weight": (vocab, h)}
    if tied:
        del shapes["output.weight"]
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
        recipe = "output.weight" if tied and name == "token_embd.weight" else name  # tied: the head's type
        qtype = gguf.GGMLQuantizationType[k_quant_fallback(
            q4_k_m_type(recipe, layers) if quant == "Q4_K_M" else quant, shp[-1])]
        w.add_tensor(name, quantize(t, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors and len(w.tensors) > 1:
        return Path(out).with_name(f"{Path(out).stem}-00001-of-{len(w.tensors):05d}.gguf")
    return Path(out)


def preset_model(preset: str | None, shape: str, layers: int | None, tokenizer: str, vocab: int | None,
                 tied: bool | None, arch: str = "llama") -> dict:
    """The model --quantize writes: a named preset (tools.models._llamacpp_quantized.PRESETS) or an `arch` model
    of `shape` (Gemma 3 with its 512-token window), with any of layers / tokenizer / vocab / tied given on the
    command line overriding it."""
    from tools.models._llamacpp_quantized import PRESETS

    if preset is not None:
        p = dict(PRESETS[preset])
    else:
        p = dict(arch=arch, layers=4, rms_norm_eps=1e-5, context_length=8192, tokenizer="smollm2", tied=False,
                 **SHAPES[shape], **(dict(sliding_window=512) if arch == "gemma3" else {}))
    if layers is not None:
        p["layers"] = layers
    if preset is None or tokenizer != "smollm2":
        p["tokenizer"] = tokenizer
        p.pop("pre", None)
        p.pop("specials", None)
    if vocab is not None or "vocab" not in p:
        smollm2 = len(GGUFFile(default_model_path()).metadata["tokenizer.ggml.tokens"])
        p["vocab"] = vocab or (smollm2 if p["tokenizer"] == "smollm2" else _REAL_SIZES[p["tokenizer"]])
    if tied is not None:
        p["tied"] = tied
    return p


def smollm2_tokenizer(vocab: int):
    """A GGUFWriter -> None writing the embedded SmolLM2 vocabulary padded to `vocab` tokens, no chat template
    (tools.models._llamacpp_quantized's add_tokenizer for the "smollm2" tokenizer)."""
    return lambda w: copy_default_tokenizer(w, chat_template=False, pad_to=vocab)


def main(argv: list[str] | None = None) -> int:
    from tools.models import _llamacpp_quantized as llamacpp_quantized

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--layers", type=int, default=None, help="blocks (default: 4, or the preset's)")
    ap.add_argument("--quant", default="Q4_K_M", help="Q4_K_M or a ggml type name (Q4_K, Q8_0, ...), by our writers")
    ap.add_argument("--quantize", choices=llamacpp_quantized.QUANTIZE_TYPES, default=None,
                    help="instead: write an F16 source and quantize it with llama.cpp's own quantizer and recipe "
                         "(needs pagedeck[peers])")
    ap.add_argument("--preset", choices=sorted(llamacpp_quantized.PRESETS), default=None,
                    help="a real model's architecture, shapes, layers, vocabulary and head (with --quantize)")
    ap.add_argument("--arch", choices=llamacpp_quantized.ARCHS, default="llama",
                    help="with --quantize and --shape: the architecture (q/k/v biases for qwen2, Gemma 3's norms)")
    ap.add_argument("--std", type=float, default=0.02, help="with --quantize: the random matrices' std")
    ap.add_argument("--source-type", choices=llamacpp_quantized.SOURCE_TYPES, default="F16",
                    help="the unquantized source --quantize writes (deleted afterwards)")
    ap.add_argument("--keep-source", action="store_true", help="keep --quantize's source file (OUT.F16.gguf)")
    ap.add_argument("--no-chat-template", action="store_true", help="write no tokenizer.chat_template")
    ap.add_argument("--split-max-tensors", type=int, default=0, help="write a split set, this many tensors a file")
    ap.add_argument("--vocab", type=int, default=None,
                    help="vocabulary size: SmolLM2's tokens padded with unused ones (e.g. 262144, Gemma 3's)")
    ap.add_argument("--tied", action=argparse.BooleanOptionalAction, default=None,
                    help="no output.weight: the token embedding is the head (default: untied, or the preset's)")
    ap.add_argument("--tokenizer", choices=TOKENIZERS, default="smollm2",
                    help="bpe: a Qwen-2.5-sized byte-level BPE (151,936 tokens), spm: a Gemma-3-sized SentencePiece "
                         "vocabulary (262,144); --vocab sets their size")
    args = ap.parse_args(argv)
    if args.preset and not args.quantize:
        ap.error("--preset needs --quantize (llama.cpp's recipe)")
    if args.quantize:
        import time

        p = preset_model(args.preset, args.shape, args.layers, args.tokenizer, args.vocab, args.tied, args.arch)
        template = None if args.no_chat_template else GGUFFile(default_model_path()).metadata["tokenizer.chat_template"]
        start = time.perf_counter()
        try:
            path = llamacpp_quantized.write_quantized_gguf(
                args.out, p, args.quantize, source_type=args.source_type, chat_template=template,
                keep_source=args.keep_source, std=args.std, add_tokenizer=smollm2_tokenizer(p["vocab"]), name=f"random {args.preset or args.shape} ({p['layers']} layers, "
                                                   f"{args.quantize} by llama.cpp)")
        except llamacpp_quantized.QuantizeError as e:
            ap.exit(1, f"{e}\n")
        print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - start:.0f} s; "
              "tensor types:")
        print("\n".join("  " + line for line in llamacpp_quantized.type_mix(llamacpp_quantized.tensor_types(path))))
        return 0
    path = write_random_gguf(args.out, args.shape, args.layers or 4, args.quant,
                             chat_template=not args.no_chat_template, split_max_tensors=args.split_max_tensors,
                             vocab=args.vocab, pad_vocab=args.vocab is not None and args.tokenizer == "smollm2",
                             tied=bool(args.tied), tokenizer=args.tokenizer)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

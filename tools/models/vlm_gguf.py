"""Write the language-model GGUF of an HF vision-language model folder, as llama.cpp's convert_hf_to_gguf.py
does for SmolVLM / Idefics3 and Gemma 3: `python -m tools.models.vlm_gguf FOLDER OUT.gguf [--type f32|f16|q8_0]`.

With `python -m tools.models.mmproj_gguf FOLDER mmproj-OUT.gguf` beside it, that is the pair LM Studio downloads
(`publisher/model/Model-F16.gguf` + `mmproj-Model-F16.gguf`). What the converter does and this repeats:
- the decoder's tensors only (`model.text_model.*`, `language_model.model.*`, `model.language_model.*`;
  the vision tower and projector go to the mmproj), named by gguf's tensor table for the text
  architecture ("llama" for Idefics3's Llama, "gemma3"), Llama's q/k rows permuted to llama.cpp's
  interleaved rotary order, Gemma's RMSNorm weights stored as 1 + w, a tied head left out;
- the text config's hyperparameters (Gemma 3: the global layers' rope base, the sliding window);
- the tokenizer as tokenizer.ggml.*: a byte-level BPE tokenizer.json becomes model "gpt2" with its vocabulary
  in id order, its merges, the pre-tokenizer's llama.cpp name (the one whose split regexes it uses), token
  type 3 (control) for added special tokens such as `<image>`, `<fake_token_around_image>`, `<global-img>`,
  `<row_1_col_1>`, `<start_of_image>`, `<image_soft_token>`, `<end_of_image>` and 4 (user-defined) for other
  added tokens, unused "[PADn]" rows up to the embedding's size; BOS/EOS ids and add_bos from
  tokenizer_config.json, and the chat template.
SentencePiece tokenizers (the real Gemma 3's tokenizer.model) are not converted here: the tiny test models
use a byte-level BPE vocabulary.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors import safe_open

from engine.model.tokenizer.gguf_vocab import PRE_SPLITS
from engine.model.vlm_text import is_vlm_config, text_config, text_name

_ARCH = {"llama": "llama", "gemma3_text": "gemma3"}
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5
_TYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
          "q8_0": gguf.GGMLQuantizationType.Q8_0}


def write_vlm_text_gguf(folder: str | Path, out: str | Path, dtype: str = "f32") -> Path:
    """The language model + tokenizer of an Idefics3/SmolVLM or Gemma 3 HF folder as a GGUF at `out`;
    dtype: the 2-D weights' type (f32, f16, q8_0); 1-D tensors stay F32, as llama.cpp writes them."""
    folder, out = Path(folder), Path(out)
    if dtype not in _TYPES:
        raise ValueError(f"dtype must be one of {', '.join(_TYPES)}")
    cfg = json.loads((folder / "config.json").read_text())
    if not is_vlm_config(cfg):
        raise ValueError(f"{folder} is not a vision-language model folder (config.json has no text_config)")
    c = text_config(cfg)
    arch = _ARCH.get(c["model_type"])
    if arch is None:
        raise ValueError(f"text model type {c['model_type']!r} is not converted here (only {', '.join(_ARCH)})")
    n_layers, hidden = c["num_hidden_layers"], c["hidden_size"]
    heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    head_dim = c.get("head_dim") or hidden // heads
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if arch == "gemma3":
        rope = rope.get("full_attention", rope)  # llama.cpp keeps the local layers' base at 10000
    theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(folder.name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else
                    gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_block_count(n_layers)
    w.add_context_length(c.get("max_position_embeddings", 2048))
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if arch == "gemma3":
        w.add_sliding_window(c["sliding_window"])
        if c.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(c["final_logit_softcapping"])
    vocab = int(c["vocab_size"])
    w.add_vocab_size(vocab)
    write_tokenizer(w, folder, vocab)
    _write_tensors(w, folder, arch, c, n_layers, heads, kv_heads, _TYPES[dtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_tokenizer(w: gguf.GGUFWriter, folder: Path, vocab_size: int) -> None:
    """tokenizer.ggml.* of a folder's byte-level BPE tokenizer.json + tokenizer_config.json."""
    tj = json.loads((folder / "tokenizer.json").read_text())
    model = tj.get("model") or {}
    if model.get("type") != "BPE" or "ByteLevel" not in json.dumps(tj.get("pre_tokenizer")):
        raise ValueError(f"{folder}: only byte-level BPE tokenizers are converted (got {model.get('type')})")
    by_id = {i: t for t, i in model["vocab"].items()}
    kinds = {}
    for added in tj.get("added_tokens") or []:
        by_id[added["id"]] = added["content"]
        kinds[added["id"]] = _CONTROL if added.get("special") else _USER_DEFINED
    size = max(vocab_size, max(by_id) + 1)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    types = [kinds.get(i, _NORMAL if i in by_id else _UNUSED) for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_tokenizer_name(tj.get("pre_tokenizer")))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    tcfg_path = folder / "tokenizer_config.json"
    tcfg = json.loads(tcfg_path.read_text()) if tcfg_path.is_file() else {}
    ids = {t: i for i, t in enumerate(tokens)}
    for key, add in (("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id),
                     ("pad_token", w.add_pad_token_id), ("unk_token", w.add_unk_token_id)):
        text = tcfg.get(key)
        text = text.get("content") if isinstance(text, dict) else text
        if text in ids:
            add(ids[text])
    if "add_bos_token" in tcfg:
        w.add_add_bos_token(bool(tcfg["add_bos_token"]))
    template = tcfg.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if template:
        w.add_chat_template(template)


def pre_tokenizer_name(pre: dict | None) -> str:
    """llama.cpp's tokenizer.ggml.pre for a tokenizer.json pre_tokenizer: the name whose split regexes
    (engine.model.tokenizer.gguf_vocab.PRE_SPLITS) are the ones it applies, in order."""
    pieces = (pre or {}).get("pretokenizers") or [pre or {}]
    regexes = [p["pattern"]["Regex"] for p in pieces if p.get("type") == "Split" and "Regex" in p.get("pattern", {})]
    if not regexes and any(p.get("type") == "ByteLevel" and p.get("use_regex", True) for p in pieces):
        return "gpt2"  # ByteLevel's own regex is GPT-2's
    for name, splits in PRE_SPLITS.items():
        if splits == regexes:
            return name
    raise ValueError(f"no llama.cpp pre-tokenizer splits text like {regexes}")


def _write_tensors(w: gguf.GGUFWriter, folder: Path, arch: str, c: dict, n_layers: int, heads: int,
                   kv_heads: int, qtype: gguf.GGMLQuantizationType) -> None:
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, n_layers)
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():
                name = text_name(key)
                if name is None or (name == "lm_head.weight" and c.get("tie_word_embeddings")):
                    continue
                target = names.get_name(name, try_suffixes=(".weight", ".bias"))
                if target is None:
                    raise KeyError(f"gguf has no {arch} name for {key}")
                t = st.get_tensor(key).float()
                if arch == "gemma3" and name.endswith("norm.weight"):
                    t = t + 1  # Gemma's (1 + w) RMSNorm, stored as llama.cpp multiplies by it
                if arch == "llama" and "q_proj" in name:
                    t = _permute(t, heads)
                elif arch == "llama" and "k_proj" in name:
                    t = _permute(t, kv_heads)
                _add(w, target, t, qtype)


def _permute(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF's rotate-half row order -> llama.cpp's interleaved pairs (convert_hf_to_gguf's LlamaModel.permute)."""
    rows = t.shape[0]
    return t.reshape(n_head, 2, rows // n_head // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def _add(w: gguf.GGUFWriter, name: str, t: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> None:
    data = np.ascontiguousarray(t.numpy().astype(np.float32))
    if data.ndim < 2 or qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType.F32)
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, data.astype(np.float16), raw_dtype=qtype)
    else:
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="HF vision-language model folder (Idefics3 / SmolVLM or Gemma 3)")
    ap.add_argument("out", type=Path, help="the language-model GGUF to write")
    ap.add_argument("--type", choices=sorted(_TYPES), default="f16")
    args = ap.parse_args(argv)
    print(write_vlm_text_gguf(args.folder, args.out, args.type))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

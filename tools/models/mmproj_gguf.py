"""Write llama.cpp's mmproj GGUF (clip.cpp's vision file) from an HF vision-language model folder:
`python -m tools.models.mmproj_gguf MODEL_FOLDER OUT.gguf [--type f32|f16]`.

Names and keys follow llama.cpp's convert_hf_to_gguf.py (`--mmproj`) for Idefics3 / SmolVLM and Gemma 3:
general.architecture "clip", clip.projector_type, clip.vision.* hyperparameters, image mean/std, the
Idefics3 scale factor and first-resize edge (clip.vision.preproc_image_size), gguf's V_* tensor names, the
Gemma 3 soft-embedding norm stored as 1 + w. With --type f16, matrices are F16 and 1-D tensors and the
embeddings (patch, position) stay F32, as llama.cpp writes them; f32 writes everything F32 (llama.cpp's F32
would still store Gemma 3's input projection as F16). Tests use it to make the GGUF twin of a tiny random model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFType, GGUFWriter, LlamaFileType

from engine.vision.encoder import GEMMA3, IDEFICS3
from engine.vision.hf_folder import load_hf_vision
from engine.vision.mmproj import SOFT_EMB_NORM, gguf_name


def write_mmproj(folder: str | Path, out: str | Path, dtype: str = "f32") -> Path:
    """The vision side of the HF folder as an mmproj GGUF at `out`."""
    if dtype not in ("f32", "f16"):
        raise ValueError("dtype must be f32 or f16")
    enc = load_hf_vision(folder)
    c, pre = enc.siglip, enc.preprocessor
    w = GGUFWriter(str(out), "clip")
    w.add_type(GGUFType.MMPROJ)
    w.add_file_type(LlamaFileType.MOSTLY_F16 if dtype == "f16" else LlamaFileType.ALL_F32)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(enc.kind)
    w.add_vision_projection_dim(enc.text_hidden)
    w.add_vision_image_size(c.image_size)
    w.add_vision_patch_size(c.patch_size)
    w.add_vision_embedding_length(c.hidden_size)
    w.add_vision_feed_forward_length(c.intermediate_size)
    w.add_vision_block_count(c.num_hidden_layers)
    w.add_vision_head_count(c.num_attention_heads)
    w.add_vision_attention_layernorm_eps(c.layer_norm_eps)
    w.add_vision_image_mean(pre.image_mean)
    w.add_vision_image_std(pre.image_std)
    w.add_vision_use_gelu(True)
    if enc.kind == IDEFICS3:
        w.add_vision_projector_scale_factor(enc.module.connector.scale_factor)
        w.add_vision_preproc_image_size(pre.longest_edge)
    elif enc.kind == GEMMA3:
        w.add_vision_projector_scale_factor(enc.module.multi_modal_projector.kernel)
    for name, t in enc.module.state_dict().items():
        g = gguf_name(name)
        data = t.float().numpy()
        if g == SOFT_EMB_NORM:
            data = data + np.float32(1.0)
        keep_f32 = dtype == "f32" or data.ndim == 1 or ".embeddings." in name
        if keep_f32:
            w.add_tensor(g, data.astype(np.float32), raw_dtype=GGMLQuantizationType.F32)
        else:
            w.add_tensor(g, data.astype(np.float16), raw_dtype=GGMLQuantizationType.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="HF model folder (Idefics3 / SmolVLM or Gemma 3)")
    ap.add_argument("out", type=Path, help="the mmproj GGUF to write")
    ap.add_argument("--type", choices=("f32", "f16"), default="f16")
    args = ap.parse_args(argv)
    print(write_mmproj(args.folder, args.out, args.type))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

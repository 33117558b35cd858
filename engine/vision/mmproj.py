"""llama.cpp's mmproj GGUF (clip.cpp's vision encoder file): reading it, and the name table the writer
(tools/models/mmproj_gguf.py) shares.

Tensor names are gguf's MODEL_TENSOR.V_* table (`v.patch_embd`, `v.position_embd`, `v.blk.N.attn_q`,
`v.blk.N.ln1`, `v.blk.N.ffn_up`, `v.post_ln`, `mm.model.fc` for Idefics3, `mm.input_projection` and
`mm.soft_emb_norm` for Gemma 3), keys are `clip.*` / `clip.vision.*` (projector type, image size, patch size,
image mean/std, layer count, projector scale factor, ...). Two conventions differ from transformers: the Gemma 3
soft-embedding norm is stored as 1 + w (clip.cpp multiplies by it), and the image preprocessing settings live
in the metadata rather than a preprocessor_config.json.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import torch
from gguf import MODEL_TENSOR, TENSOR_NAMES, GGMLQuantizationType, GGUFReader, Keys
from gguf.quants import dequantize

from engine.vision import image_ops
from engine.vision.encoder import GEMMA3, IDEFICS3, KINDS, ProjectorShape, VisionEncoder
from engine.vision.siglip import SiglipConfig

V = Keys.ClipVision
# engine.vision module names (below the vision model's prefix) -> GGUF names
_TOP = {
    "embeddings.patch_embedding": TENSOR_NAMES[MODEL_TENSOR.V_ENC_EMBD_PATCH],
    "embeddings.position_embedding": TENSOR_NAMES[MODEL_TENSOR.V_ENC_EMBD_POS],
    "post_layernorm": TENSOR_NAMES[MODEL_TENSOR.V_POST_NORM],
}
_LAYER = {
    "self_attn.q_proj": MODEL_TENSOR.V_ENC_ATTN_Q,
    "self_attn.k_proj": MODEL_TENSOR.V_ENC_ATTN_K,
    "self_attn.v_proj": MODEL_TENSOR.V_ENC_ATTN_V,
    "self_attn.out_proj": MODEL_TENSOR.V_ENC_ATTN_O,
    "layer_norm1": MODEL_TENSOR.V_ENC_INPUT_NORM,
    "layer_norm2": MODEL_TENSOR.V_ENC_POST_ATTN_NORM,
    "mlp.fc1": MODEL_TENSOR.V_ENC_FFN_UP,
    "mlp.fc2": MODEL_TENSOR.V_ENC_FFN_DOWN,
}
_PROJECTOR = {
    "connector.modality_projection.proj.weight": TENSOR_NAMES[MODEL_TENSOR.V_MMPROJ_FC] + ".weight",
    "multi_modal_projector.mm_input_projection_weight": TENSOR_NAMES[MODEL_TENSOR.V_MM_INP_PROJ] + ".weight",
    "multi_modal_projector.mm_soft_emb_norm.weight": TENSOR_NAMES[MODEL_TENSOR.V_MM_SOFT_EMB_NORM] + ".weight",
}
SOFT_EMB_NORM = _PROJECTOR["multi_modal_projector.mm_soft_emb_norm.weight"]
_VISION_PREFIX = {IDEFICS3: "vision_model.", GEMMA3: "vision_tower."}
_PROJECTOR_PREFIX = {IDEFICS3: "connector.", GEMMA3: "multi_modal_projector."}
_LAYER_RE = re.compile(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def gguf_name(name: str) -> str:
    """engine.vision's module name for a vision tensor (Idefics3Vision / Gemma3Vision state dict) -> GGUF."""
    if name in _PROJECTOR:
        return _PROJECTOR[name]
    local = name.split(".", 1)[1]  # drop vision_model. / vision_tower.
    stem, suffix = local.rsplit(".", 1)
    if stem in _TOP:
        return f"{_TOP[stem]}.{suffix}"
    m = _LAYER_RE.match(local)
    if m and m.group(2) in _LAYER:
        return TENSOR_NAMES[_LAYER[m.group(2)]].format(bid=int(m.group(1))) + f".{m.group(3)}"
    raise KeyError(f"no GGUF name for vision tensor {name}")


def is_mmproj(path: str | Path) -> bool:
    """A GGUF whose architecture is clip.cpp's and that holds a vision encoder."""
    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError, IndexError, KeyError, TypeError):  # not a GGUF, or a truncated one
        return False
    return _field(reader, "general.architecture") == "clip" and bool(_field(reader, Keys.Clip.HAS_VISION_ENCODER))


def load_mmproj(path: str | Path, device="cpu", dtype=torch.float32) -> VisionEncoder:
    path = Path(path)
    reader = GGUFReader(str(path))
    kind = _field(reader, V.PROJECTOR_TYPE) or _field(reader, Keys.Clip.PROJECTOR_TYPE)
    if kind not in KINDS:
        raise ValueError(f"{path.name}: projector type {kind!r} is not supported (only {', '.join(KINDS)})")
    siglip = SiglipConfig(
        hidden_size=int(_field(reader, V.EMBEDDING_LENGTH)),
        intermediate_size=int(_field(reader, V.FEED_FORWARD_LENGTH)),
        num_hidden_layers=int(_field(reader, V.BLOCK_COUNT)),
        num_attention_heads=int(_field(reader, V.Attention.HEAD_COUNT)),
        image_size=int(_field(reader, V.IMAGE_SIZE)),
        patch_size=int(_field(reader, V.PATCH_SIZE)),
        layer_norm_eps=float(_field(reader, V.Attention.LAYERNORM_EPS, 1e-6)),
    )
    text_hidden = int(_field(reader, V.PROJECTION_DIM))
    mean = [float(x) for x in _field(reader, V.IMAGE_MEAN, [0.5, 0.5, 0.5])]
    std = [float(x) for x in _field(reader, V.IMAGE_STD, [0.5, 0.5, 0.5])]
    scale = _field(reader, V.Projector.SCALE_FACTOR)
    if kind == IDEFICS3:
        shape = ProjectorShape(kind, text_hidden, scale_factor=int(scale or 2))
        longest = int(_field(reader, V.PREPROC_IMAGE_SIZE, 4 * siglip.image_size))
        pre = {"size": {"longest_edge": longest}, "max_image_size": {"longest_edge": siglip.image_size},
               "resample": image_ops.LANCZOS, "do_image_splitting": True}
    else:
        # clip.cpp pools Gemma 3 patches by 4 per side unless the file says otherwise
        per_side = siglip.patches_per_side // int(scale or 4)
        shape = ProjectorShape(kind, text_hidden, mm_tokens_per_image=per_side * per_side)
        pre = {"size": {"height": siglip.image_size, "width": siglip.image_size}, "resample": image_ops.BILINEAR}
    pre.update(image_mean=mean, image_std=std)
    state = _state(reader, kind, siglip.num_hidden_layers)
    return VisionEncoder(shape, siglip, state, pre, _identity(kind, path), device=device, dtype=dtype)


def _state(reader: GGUFReader, kind: str, n_layers: int) -> dict[str, torch.Tensor]:
    """GGUF tensors renamed to engine.vision's module names, dequantized to float32."""
    by_gguf = {}
    prefix = _VISION_PREFIX[kind]
    stems = list(_TOP) + [f"encoder.layers.{i}.{part}" for i in range(n_layers) for part in _LAYER]
    for stem in stems:
        for suffix in ("weight", "bias"):
            name = f"{prefix}{stem}.{suffix}"
            by_gguf[gguf_name(name)] = name
    for name, g in _PROJECTOR.items():
        if name.startswith(_PROJECTOR_PREFIX[kind]):
            by_gguf[g] = name
    state = {}
    for t in reader.tensors:
        name = by_gguf.get(t.name)
        if name is None:
            continue
        data = np.asarray(t.data)
        if t.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            data = dequantize(data, t.tensor_type)
        tensor = torch.from_numpy(np.array(data, dtype=np.float32))
        if t.name == SOFT_EMB_NORM:
            tensor = tensor - 1.0  # stored as 1 + w
        state[name] = tensor
    return state


def _field(reader: GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _identity(kind: str, path: Path) -> str:
    s = path.stat()
    h = hashlib.sha256(f"{kind}\0{path.resolve()}\0{s.st_size}\0{s.st_mtime_ns}".encode())
    return f"{kind}:{h.hexdigest()[:16]}"

"""A vision encoder from a Hugging Face VLM folder (config.json with a vision_config, safetensors weights).

transformers names the vision weights differently across versions and checkpoints (SmolVLM:
`model.vision_model.*`, `model.connector.*`; Gemma 3: `vision_tower.vision_model.*` in Google's files,
`vision_tower.*` when transformers 5 saves, `multi_modal_projector.*` in both), so the prefixes are found from
the names themselves: whatever precedes `embeddings.patch_embedding.weight` is the vision model's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.vision.encoder import GEMMA3, IDEFICS3, ProjectorShape, VisionEncoder
from engine.vision.siglip import IDEFICS3_DEFAULTS, SiglipConfig

# config.json model_type -> projector kind
MODEL_TYPES = {"idefics3": IDEFICS3, "smolvlm": IDEFICS3, "gemma3": GEMMA3}
_PATCH = "embeddings.patch_embedding.weight"
_PROJECTOR_PREFIX = {IDEFICS3: ("connector.", "vision_model."), GEMMA3: ("multi_modal_projector.", "vision_tower.")}


def vision_kind(folder: Path) -> str | None:
    """The projector kind of an HF folder whose config.json describes a supported VLM, else None."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or not isinstance(config.get("vision_config"), dict):
        return None
    return MODEL_TYPES.get(config.get("model_type"))


def load_hf_vision(folder: str | Path, device="cpu", dtype=torch.float32) -> VisionEncoder:
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    kind = MODEL_TYPES.get(config.get("model_type"))
    if kind is None or not isinstance(config.get("vision_config"), dict):
        raise ValueError(f"{folder} is not an Idefics3/SmolVLM or Gemma 3 vision-language model")
    siglip = SiglipConfig.from_hf(config["vision_config"], IDEFICS3_DEFAULTS if kind == IDEFICS3 else None)
    text_hidden = (config.get("text_config") or {}).get("hidden_size")
    if not text_hidden:
        raise ValueError(f"{folder}: config.json gives no text_config.hidden_size")
    if kind == IDEFICS3:
        shape = ProjectorShape(kind, int(text_hidden), scale_factor=int(config.get("scale_factor", 2)))
        token_id = config.get("image_token_id")
    else:
        shape = ProjectorShape(kind, int(text_hidden), mm_tokens_per_image=int(config.get("mm_tokens_per_image", 256)))
        token_id = config.get("image_token_index", config.get("image_token_id"))
    files = _safetensors_files(folder)
    state = _vision_state(files, kind)
    preprocessor = folder / "preprocessor_config.json"
    preprocessor_config = json.loads(preprocessor.read_text()) if preprocessor.is_file() else {}
    return VisionEncoder(shape, siglip, state, preprocessor_config, _identity(kind, files),
                         image_token_id=token_id, device=device, dtype=dtype)


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {folder}")
    return files


def _vision_state(files: list[Path], kind: str) -> dict[str, torch.Tensor]:
    """The vision model's and projector's tensors, renamed to engine.vision's module names."""
    projector, vision = _PROJECTOR_PREFIX[kind]
    names = {}
    for f in files:
        with safe_open(str(f), "pt") as st:
            names.update(dict.fromkeys(st.keys(), f))
    patch = [k for k in names if k.endswith(_PATCH)]
    if len(patch) != 1:
        raise ValueError(f"expected one vision patch embedding, found {patch}")
    vision_prefix = patch[0][: -len(_PATCH)]
    proj_keys = [k for k in names if f".{projector}" in f".{k}" and not k.startswith(vision_prefix)]
    rename = {k: vision + k[len(vision_prefix):] for k in names if k.startswith(vision_prefix)}
    rename.update({k: k[k.index(projector):] for k in proj_keys})
    state = {}
    for f in files:
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                # SigLIP's pooling head is not part of what a VLM feeds its language model
                if k in rename and ".head." not in k:
                    state[rename[k]] = st.get_tensor(k)
    return state


def _identity(kind: str, files: list[Path]) -> str:
    h = hashlib.sha256(kind.encode())
    for f in files:
        s = f.stat()
        h.update(f"{f.resolve()}\0{s.st_size}\0{s.st_mtime_ns}\0".encode())
    return f"{kind}:{h.hexdigest()[:16]}"

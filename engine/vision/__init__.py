"""Images for vision-language models: a PIL image in, the embeddings the language model consumes out.

`load_vision(model_path)` finds a model's vision side: an HF folder whose config.json has a vision_config
(Idefics3 / SmolVLM, Gemma 3), a GGUF with llama.cpp's `mmproj*.gguf` beside it (LM Studio's layout), or an
Ollama model blob whose manifest names a projector layer. `VisionEncoder.encode(image)` gives `ImageTokens`
(prompt text around each run of placeholders + that run's embeddings); `content_hash` names an image's
embeddings for caching.
`image_input` (decoding with limits) is torch-free and shared with the app, so this package loads torch only
when one of the encoder names is first used (PEP 562). Never imports Qt.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from engine.vision.encoder import ImageTokens, VisionEncoder

__all__ = ["ImageTokens", "VisionEncoder", "content_hash", "find_mmproj", "load_vision"]


def find_mmproj(model_path: str | Path) -> Path | None:
    """The mmproj GGUF that goes with a model GGUF (or a folder holding one): `mmproj*.gguf` in the same
    folder (LM Studio's and llama.cpp's layout; of several, the one whose name shares the longest start with
    the model's, the rule engine.model.catalog.discovery shows in the model list), or for an Ollama model blob the
    projector layer its manifest names."""
    path = Path(model_path)
    folder = path if path.is_dir() else path.parent
    if folder.name == "blobs" or path.name.startswith("sha256-"):
        return _ollama_projector(path)
    from engine.vision.mmproj import is_mmproj
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.name.lower().startswith("mmproj")
                   and p.name.lower().endswith(".gguf") and p != path and is_mmproj(p))
    if len(found) <= 1 or path.is_dir():
        return found[0] if found else None
    stem = path.name.lower()

    def shared(p: Path) -> int:
        return len(os.path.commonprefix([re.sub(r"^mmproj[-_.]?(model[-_.]?)?", "", p.name.lower()), stem]))

    return max(found, key=shared)  # max keeps the first (in name order) of equals


_OLLAMA_MODEL = "application/vnd.ollama.image.model"
_OLLAMA_PROJECTOR = "application/vnd.ollama.image.projector"


def _ollama_projector(blob: Path) -> Path | None:
    """Ollama's store: manifests/<registry>/<namespace>/<model>/<tag> list a model's layers by digest
    (blobs/sha256-<hex>); the projector layer of the manifest whose model layer is this blob."""
    root = blob.parent.parent
    manifests = root / "manifests"
    if not manifests.is_dir():
        return None
    digest = blob.name.replace("-", ":", 1)
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        try:
            layers = json.loads(manifest.read_text()).get("layers") or []
        except (OSError, ValueError, AttributeError):
            continue
        by_type = {layer.get("mediaType"): layer.get("digest") for layer in layers if isinstance(layer, dict)}
        projector = by_type.get(_OLLAMA_PROJECTOR)
        if by_type.get(_OLLAMA_MODEL) == digest and projector:
            candidate = root / "blobs" / str(projector).replace(":", "-", 1)
            return candidate if candidate.is_file() else None
    return None


def load_vision(model_path: str | Path, device="cpu", dtype: "torch.dtype | None" = None) -> "VisionEncoder | None":
    """The vision encoder of a model path, or None when the model has none this package can run (float32
    unless `dtype` says otherwise)."""
    import torch

    from engine.vision.hf_folder import load_hf_vision, vision_kind
    from engine.vision.mmproj import is_mmproj, load_mmproj
    dtype = torch.float32 if dtype is None else dtype
    path = Path(model_path)
    if path.is_dir() and (path / "config.json").is_file():
        return load_hf_vision(path, device, dtype) if vision_kind(path) else None
    if path.is_file() and (path.name.lower().startswith("mmproj") or (path.name.startswith("sha256-")
                                                                      and is_mmproj(path))):
        return load_mmproj(path, device, dtype)  # a projector named directly (an Ollama projector blob too)
    if path.is_dir() or path.suffix.lower() == ".gguf" or path.name.startswith("sha256-"):
        mmproj = find_mmproj(path) if path.exists() else None
        return load_mmproj(mmproj, device, dtype) if mmproj else None
    return None


def __getattr__(name: str) -> Any:
    if name in ("ImageTokens", "VisionEncoder", "content_hash"):
        from engine.vision import encoder
        return getattr(encoder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

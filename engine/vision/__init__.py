"""Images for vision-language models: a PIL image in, the embeddings the language model consumes out.

`load_vision(model_path)` finds a model's vision side: an HF folder whose config.json has a vision_config
(Idefics3 / SmolVLM, Gemma 3), or a GGUF with llama.cpp's `mmproj*.gguf` beside it (LM Studio's layout; Ollama's
blob store is skipped). `VisionEncoder.encode(image)` gives `ImageTokens` (prompt text around each run of
placeholders + that run's embeddings); `content_hash` names an image's embeddings for caching.
`image_input` (decoding with limits) is torch-free and shared with the app, so this package loads torch only
when one of the encoder names is first used (PEP 562). Never imports Qt.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from engine.vision.encoder import ImageTokens, VisionEncoder

__all__ = ["ImageTokens", "VisionEncoder", "content_hash", "find_mmproj", "load_vision"]


def find_mmproj(model_path: str | Path) -> Path | None:
    """The mmproj GGUF that goes with a model GGUF (or a folder holding one): `mmproj*.gguf` in the same
    folder, the first by name. None for Ollama's blob store (its projector is a separate blob we don't map)."""
    path = Path(model_path)
    folder = path if path.is_dir() else path.parent
    if folder.name == "blobs" or path.name.startswith("sha256-"):
        return None
    candidates = sorted(p for p in folder.iterdir() if p.is_file() and p.name.lower().startswith("mmproj")
                        and p.name.lower().endswith(".gguf") and p != path)
    from engine.vision.mmproj import is_mmproj
    return next((p for p in candidates if is_mmproj(p)), None)


def load_vision(model_path: str | Path, device="cpu", dtype: "torch.dtype | None" = None) -> "VisionEncoder | None":
    """The vision encoder of a model path, or None when the model has none this package can run (float32
    unless `dtype` says otherwise)."""
    import torch

    from engine.vision.hf_folder import load_hf_vision, vision_kind
    from engine.vision.mmproj import load_mmproj
    dtype = torch.float32 if dtype is None else dtype
    path = Path(model_path)
    if path.is_dir() and (path / "config.json").is_file():
        return load_hf_vision(path, device, dtype) if vision_kind(path) else None
    if path.is_file() and path.name.lower().startswith("mmproj"):
        return load_mmproj(path, device, dtype)
    if path.is_dir() or path.suffix.lower() == ".gguf":
        mmproj = find_mmproj(path) if path.exists() else None
        return load_mmproj(mmproj, device, dtype) if mmproj else None
    return None


def __getattr__(name: str) -> Any:
    if name in ("ImageTokens", "VisionEncoder", "content_hash"):
        from engine.vision import encoder
        return getattr(encoder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

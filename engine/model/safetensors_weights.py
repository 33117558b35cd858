"""Reading a safetensors folder (an HF checkpoint) into an HF-named state dict: the text decoder's tensors
(a multimodal checkpoint's vision tower skipped), dense in `dtype` or quantized to q8 at load."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from engine.model import moe, vlm_text
from engine.model.packing import repack
from engine.model.config import ModelConfig
from engine.model.qlinear import Q8Linear
from engine.model.tensor_names import check_names, check_shapes, expected_tensor_names, keeps_dense_copy

Progress = Callable[[float], None] | None

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # old checkpoints saved this buffer; it is recomputed
# Multimodal checkpoints (Gemma 3 4B+): the text decoder under a prefix, the vision tower beside it.
_TEXT_PREFIXES = vlm_text.TEXT_PREFIXES  # Idefics3/SmolVLM's model.text_model.* too
_VISION_PREFIXES = vlm_text.VISION_PREFIXES


def _text_name(name: str) -> str | None:
    """The decoder's name for a checkpoint tensor name; None for vision-tower tensors."""
    if name.startswith(_VISION_PREFIXES):
        return None
    for prefix, replacement in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return replacement + name[len(prefix):]
    return name


def _stored_to_effective(name: str, t: torch.Tensor, config: ModelConfig, dtype: torch.dtype) -> torch.Tensor:
    """HF Gemma stores RMSNorm scales as w and multiplies by (1 + w) in fp32: fold the 1 in here, in fp32
    (exactly HF's sum), so the model runs one plain RMSNorm."""
    if config.norm_weight_offset and name.endswith("norm.weight"):
        return (t.float() + config.norm_weight_offset).to(dtype)
    return t.to(dtype)


def load_hf_folder(folder: Path, dtype: torch.dtype, device: torch.device, progress: Progress, fmt: str = "dense"):
    from safetensors import SafetensorError, safe_open

    cfg_path = folder / "config.json"  # there: load_weights checked the path
    try:
        config = ModelConfig.from_hf(json.loads(cfg_path.read_text()))
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path} is not valid JSON: {e}") from None

    files = _safetensors_files(folder)
    keep_dense = keeps_dense_copy(config, fmt, lambda name: "F32")
    expected = expected_tensor_names(config)
    wanted = set(expected)
    state: dict[str, torch.Tensor] = {}
    unexpected = []

    def keep(name: str, t: torch.Tensor) -> None:
        if repack.keeps_packed(name, "F32", t.dim(), fmt):
            state[name] = Q8Linear.quantize(t, keep_dense)
        else:
            state[name] = _stored_to_effective(name, t.to(device), config, dtype)
        if progress:
            progress(len(state) / len(expected))

    for file in files:
        try:
            with safe_open(file, framework="pt", device="cpu") as f:
                for stored in f.keys():
                    name = _text_name(stored)
                    # gpt-oss's stacked experts, split into the per-expert tensors the model is built from
                    split = None if name is None else moe.hf_experts(config, name, lambda: f.get_tensor(stored))
                    if split is not None and wanted.issuperset(split):
                        for part, t in split.items():
                            keep(part, t)
                    elif name in wanted:
                        keep(name, f.get_tensor(stored))
                    elif name is None or (name == "lm_head.weight" and config.tie_word_embeddings):
                        continue  # vision tower; or tied: the embedding is the output projection
                    elif not name.endswith(_IGNORED_SUFFIXES):
                        unexpected.append(stored)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ValueError(f"Cannot read safetensors file {file}: {e}") from None
    check_names(folder, expected, state, unexpected)
    check_shapes(folder, config, state)
    return config, state


def _safetensors_files(folder: Path) -> list[Path]:
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index} is not a valid safetensors index: {e!r}") from None
        files = [folder / name for name in dict.fromkeys(weight_map.values())]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"{index} lists shard {f.name}, which is missing from {folder}")
        return files
    raise FileNotFoundError(
        f"{folder} has no model.safetensors or model.safetensors.index.json (only safetensors weights are supported)"
    )

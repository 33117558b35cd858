"""What a model on disk is, from its headers alone: architecture, parameter count, quantization, size.

Reads a GGUF's header (metadata and tensor table, long arrays skipped) or an HF folder's config.json
and safetensors headers (an 8-byte length and a JSON table per shard); never a tensor's data, so a
folder of multi-GB models is described in milliseconds. A model this engine cannot run is described
anyway, with the reason (`problem`), so a model list can show it greyed out.
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGMLQuantizationType, LlamaFileType

from ..config import ModelConfig

_ST_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
             "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass
class TensorEntry:
    """One stored tensor: its name as stored, shape (rows first), storage type and bytes."""
    name: str
    shape: tuple[int, ...]
    dtype: str  # ggml type name for GGUF (Q4_K, F32, ...), safetensors dtype (BF16, ...) for HF
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 1


@dataclass
class ModelInfo:
    path: Path
    kind: str  # "gguf" | "hf"
    name: str
    arch: str | None = None  # as the file names it (general.architecture / model_type)
    config: ModelConfig | None = None
    params: int = 0
    quant: str = ""  # Q4_K_M, Q8_0, BF16, ... (the file's own label where it has one)
    file_bytes: int = 0
    tensors: list[TensorEntry] = field(default_factory=list)
    problem: str | None = None  # why this engine cannot run it; None when it can

    @property
    def supported(self) -> bool:
        return self.problem is None

    @property
    def active_params(self) -> int:
        """Parameters one token computes with: all but the experts it does not choose (params if dense)."""
        return self.params - (self.config.inactive_expert_parameters() if self.config else 0)

    def parameter_summary(self) -> str:
        """The parameters in words, total and (a mixture of experts) active ones with the expert layout, as the
        Model tab shows them: "30.5B parameters, 3.3B active, 48 layers x 128 experts, 8 a token"."""
        text = f"{count_words(self.params)} parameters"
        c = self.config
        if c is None or not c.num_experts:
            return text
        sparse = sum(c.layer_is_sparse(i) for i in range(c.num_layers))
        return (f"{text}, {count_words(self.active_params)} active, {sparse} layers x {c.num_experts} experts, "
                f"{c.experts_per_token} a token")


def count_words(n: int) -> str:
    """A parameter count in short form: 30.5B, 135.0M, 12.3k."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def read_model_info(path: str | Path) -> ModelInfo:
    """Describe a .gguf file or an HF model folder from headers; problems go in .problem, never raised."""
    path = Path(path)
    if path.is_dir():
        return _hf_info(path)
    info = ModelInfo(path, "gguf", path.stem)
    from ...contract import is_gguf

    if not is_gguf(path):
        info.problem = "not a .gguf file or a Hugging Face model folder"
        return info
    return _gguf_info(path, info)


# ---------------------------------------------------------------- GGUF

def _gguf_info(path: Path, info: ModelInfo) -> ModelInfo:
    from ..tokenizer import gguf_vocab
    from ..gguf.file import GGUFFile

    try:
        info.file_bytes = path.stat().st_size
        gf = GGUFFile(path, header_only=True)
    except (OSError, ValueError) as e:
        info.problem = str(e)
        return info
    meta = gf.metadata
    info.file_bytes = sum(p.stat().st_size for p in gf.parts)  # a split set: all its files
    info.arch = meta.get("general.architecture")
    info.name = str(meta.get("general.name") or path.stem)
    info.tensors = [TensorEntry(t.name, t.shape, t.tensor_type.name, t.nbytes) for t in gf.tensors]
    info.params = sum(t.numel for t in info.tensors)
    info.quant = _gguf_quant_label(meta.get("general.file_type"), info.tensors)
    try:
        info.config = ModelConfig.from_gguf(gf)
    except (ValueError, NotImplementedError, KeyError, TypeError) as e:
        info.problem = str(e)
        return info
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
    if kind not in gguf_vocab.TOKENIZER_MODELS:
        info.problem = f"its tokenizer ({kind!r}) is not supported"
    elif kind == "gpt2" and pre not in gguf_vocab.PRE_SPLITS:
        info.problem = f"its pre-tokenizer ({pre!r}) is not supported"
    else:
        info.problem = _unreadable_types(info.tensors)
    return info


def _gguf_quant_label(file_type, tensors: list[TensorEntry]) -> str:
    """llama.cpp's own label (general.file_type: MOSTLY_Q4_K_M -> Q4_K_M), else the type holding most bytes."""
    try:
        return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        pass
    weight = Counter()
    for t in tensors:
        if len(t.shape) == 2:
            weight[t.dtype] += t.nbytes
    return weight.most_common(1)[0][0] if weight else ""


def _unreadable_types(tensors: list[TensorEntry]) -> str | None:
    from ..ggml_blocks import dequantizable

    bad = sorted({t.dtype for t in tensors if not dequantizable(GGMLQuantizationType[t.dtype])})
    return f"tensor types {', '.join(bad)} cannot be read" if bad else None


# ---------------------------------------------------------------- HF folders

def _hf_info(folder: Path) -> ModelInfo:
    info = ModelInfo(folder, "hf", folder.name)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        info.problem = "no config.json: not a Hugging Face model folder"
        return info
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        info.problem = f"config.json is unreadable: {e}"
        return info
    info.arch = cfg.get("model_type")
    files = sorted(folder.glob("*.safetensors"))
    info.file_bytes = sum(f.stat().st_size for f in files)
    try:
        for f in files:
            info.tensors += _safetensors_header(f)
    except (OSError, ValueError, struct.error) as e:
        info.problem = f"unreadable safetensors header: {e}"
        return info
    info.params = sum(t.numel for t in info.tensors)
    dtypes = Counter()
    for t in info.tensors:
        dtypes[t.dtype] += t.nbytes
    info.quant = dtypes.most_common(1)[0][0] if dtypes else ""
    quant_cfg = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config")
    try:
        info.config = ModelConfig.from_hf(cfg)
    except (ValueError, NotImplementedError, KeyError, TypeError) as e:
        info.problem = str(e)
        return info
    if quant_cfg:
        method = quant_cfg.get("quant_method", "?") if isinstance(quant_cfg, dict) else "?"
        info.quant = str(method).upper()
        info.problem = (f"pre-quantized ({method}) safetensors are not supported; a GGUF of the same model, "
                        "or its unquantized folder, is")
    elif not files:
        info.problem = "no .safetensors weights (only safetensors are supported)"
    elif not (folder / "tokenizer.json").is_file():
        info.problem = "no tokenizer.json (only fast tokenizers are supported)"
    return info


def _safetensors_header(path: Path) -> list[TensorEntry]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100 << 20:
            raise ValueError(f"{path.name}: implausible header length {n}")
        header = json.loads(f.read(n))
    out = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = tuple(int(d) for d in entry["shape"])
        start, end = entry["data_offsets"]
        out.append(TensorEntry(name, shape, entry["dtype"], int(end) - int(start)))
    return out

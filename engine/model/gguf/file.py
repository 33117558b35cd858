"""A GGUF file memory-mapped, its header (engine.model.gguf.header) read once per file, its tensors as views.

Parsed here rather than with gguf.GGUFReader: the reader builds a numpy view per vocabulary string and
takes ~5 s on the default model, more than the whole load budget. The gguf package still supplies the type
tables and the fallback dequantizers.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES

from engine.model.gguf.split import join_parts
from engine.model.packing import experts, move_queue, repack
from engine.model.embedding import GGMLRows
from engine.model.ggml_blocks import dequantize
from engine.model.gguf.header import PARSE_ERRORS, GGUFTensorInfo, SkippedArray, read_header

__all__ = ["GGUFFile", "GGUFTensorInfo", "SkippedArray"]


class GGUFFile:
    """A GGUF file's metadata (decoded values) and tensor table, with its data memory-mapped.

    header_only=True leaves the tokenizer's metadata arrays longer than 64 entries (the vocabulary, scores,
    merges) undecoded, as SkippedArray: listing a folder of models then costs milliseconds per file, and
    loading the weights holds no vocabulary (the tokenizer reads it). Either way the header is parsed once
    per file (engine.model.gguf.header keeps it), so the estimate, the weights and the tokenizer of one
    load share one parse."""

    def __init__(self, path: str | Path, header_only: bool = False, _part: bool = False):
        self.path = Path(path)
        self.header_only = header_only
        try:
            with open(self.path, "rb") as f:
                # copy-on-write map: writable for torch.frombuffer, never writes to the file
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
                stat = os.fstat(f.fileno())
        except (OSError, ValueError) as e:
            if self.path.is_file() and self.path.stat().st_size == 0:
                raise ValueError(f"{self.path} is empty (0 bytes): not a GGUF file") from None
            raise ValueError(f"Cannot open GGUF file {self.path}: {e}") from None
        header = read_header(self.path, self._map, stat)
        self.header = header  # its size, mtime and extent identify this version of the file (merge_cache)
        self.metadata = dict(header.metadata)
        if not header_only:
            try:
                for key, value in header.metadata.items():
                    if isinstance(value, SkippedArray):
                        self.metadata[key] = value.values(self._map)
            except PARSE_ERRORS as e:
                raise ValueError(f"{self.path} is not a valid GGUF file (corrupt or truncated header: {e})") from None
        self.tensors: list[GGUFTensorInfo] = list(header.tensors)
        self._by_name = {t.name: t for t in self.tensors}
        self._maps = {}  # tensor name -> the map of the split part holding it (absent: this file's)
        self.parts = [self.path]
        if not _part:  # a split set's first file: its other parts' tensors join this file's
            join_parts(self)

    def version_key(self) -> str:
        """A name for this version of the file (the tokenizer's merge cache keys its entries by it): a BLAKE2b
        digest of its size, modification time and whole header (metadata and tensor table)."""
        h = hashlib.blake2b(digest_size=20)
        with memoryview(self._map) as view, view[:self.header.end] as head:
            h.update(head)
        h.update(struct.pack("<qq", self.header.size, self.header.mtime_ns))
        return h.hexdigest()

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
        """The matrix in its CPU kernel format (engine.model.packing.repack) when `fmt` packs it (or `head`: the output
        head of a packed model, dense types as q8), else None."""
        t, raw = self.rows(name, row_perm_heads)
        if not (head or repack.keeps_packed(name, t.tensor_type.name, len(t.shape), fmt)):
            return None
        row_bytes = raw.shape[1] if raw.dim() == 2 else 0

        def done(r0: int, r1: int) -> None:  # rows read: their file pages may go (permuted rows are a copy)
            if row_perm_heads is None:
                self._drop_pages(name, t.offset + r0 * row_bytes, t.offset + r1 * row_bytes)

        return repack.from_blocks(raw, t.tensor_type, tuple(t.shape), fmt, keep_dense, done)

    def packed_experts(self, name: str, fmt: str = "packed", keep_dense: bool = True) -> list | None:
        """A 3-D expert stack as one packed matrix per expert (engine.model.packing.experts) when `fmt` packs
        it, else None; each tile's file pages are dropped once read."""
        t, raw = self.rows(name)
        if not repack.keeps_packed(name, t.tensor_type.name, len(t.shape), fmt):
            return None
        return experts.pack_stack(raw, t.tensor_type, tuple(t.shape), fmt, keep_dense,
                                  lambda start, stop: self._drop_pages(name, t.offset + start, t.offset + stop))

    def packed_gate_up(self, gate: str, up: str, fmt: str = "packed", keep_dense: bool = True) -> list | None:
        """Two 3-D expert stacks (gate's and up's) as each expert's fused [gate | up] packed matrix, written once
        from the file (engine.model.packing.experts.pack_gate_up), or None where that format packs the stacks
        one by one; each tile's file pages are dropped once read."""
        (g, g_raw), (u, u_raw) = self.rows(gate), self.rows(up)
        if g.tensor_type != u.tensor_type or tuple(g.shape) != tuple(u.shape) or len(g.shape) != 3:
            return None
        return experts.pack_gate_up(g_raw, u_raw, g.tensor_type, tuple(g.shape), fmt, keep_dense,
                                    lambda start, stop: self._drop_pages(gate, g.offset + start, g.offset + stop),
                                    lambda start, stop: self._drop_pages(up, u.offset + start, u.offset + stop))

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
        if stop <= start or not hasattr(m, "madvise"):
            return
        if not move_queue.release(_address(m) + start, stop - start):  # queued behind the moves reading them
            m.madvise(mmap.MADV_DONTNEED, start, stop - start)

    def spans(self) -> list[tuple[int, int]]:
        """(address, length) of this file's map and its split parts' (engine.model.packing.move_queue)."""
        return [(_address(m), len(m)) for m in {id(m): m for m in [self._map, *self._maps.values()]}.values()
                if len(m)]

    def close(self) -> None:
        """Unmap the file (and its split parts). Only once nothing reads through a view of it: a torch view does not
        keep the map open (engine.model.settle, whose model starts on such views, never closes it: the map goes
        with its last view). A map something still exports as a buffer only has its pages dropped."""
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


def _address(m: mmap.mmap) -> int:
    """Where the map starts in this process's memory."""
    return torch.frombuffer(m, dtype=torch.uint8, count=1).data_ptr()


def _unpermute_rows(raw: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp interleaves each head's rotary halves row-wise; restore HF rotate_half order."""
    rows = raw.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot undo the rotary permutation: {rows} rows for {n_head} heads")
    return raw.reshape(n_head, rows // n_head // 2, 2, -1).transpose(1, 2).reshape(rows, -1)

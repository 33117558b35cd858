"""An embedding table kept as its file's ggml blocks: a lookup decodes only the rows it asks for.

A forward pass reads one embedding row per token, never the whole table, so an untied token embedding needs
no kernel format and no fp32 copy: GGMLRows holds the tensor's own bytes (a copy, so the mapped file can be
released after loading) and dequantizes the looked-up rows' blocks, as llama.cpp's get_rows does. The
values are exactly the file's (engine.model.ggml_blocks.dequantize, bit-identical to gguf's decoder), and
the table costs what it costs in the file (a 128k x 4096 Q4_K table: 295 MB, 2.1 GB as fp32).

A tied table is the output head too: there the packed head (engine.model.packing.repack) serves both, and its
lookups read the head's rows (engine.model.qlinear.PackedLinear.embedding), so the table is held once.
"""
from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .ggml_blocks import dequantize
from .packing import move_queue


class GGMLRows:
    """A (vocab, hidden) table of ggml rows (`raw`: (vocab, bytes per row) uint8, owned). `dense` is always
    None: nothing here is kept in fp32."""

    dense = None

    def __init__(self, raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int]):
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        n, k = int(shape[0]), int(shape[1])
        if raw.dtype != torch.uint8 or raw.shape != (n, k // block * block_bytes):
            raise ValueError(f"GGMLRows wants ({n}, {k // block * block_bytes}) uint8 bytes of {qtype.name} rows, "
                             f"got {tuple(raw.shape)} {raw.dtype}")
        self.raw, self.qtype, self.shape = raw, qtype, (n, k)

    @classmethod
    def copy_of(cls, rows: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> "GGMLRows":
        """A table over a copy of `rows` (e.g. a view of a mapped file, which may then be closed)."""
        rows = rows.reshape(int(shape[0]), -1)
        copy = torch.empty_like(rows, memory_format=torch.contiguous_format)
        move_queue.copy(rows, copy)  # with the load's other moves where the file's are queued
        return cls(copy, qtype, shape)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 rows of token ids, shape (*ids.shape, hidden): only those rows' blocks are decoded."""
        flat = ids.reshape(-1)
        rows = dequantize(self.raw.index_select(0, flat), self.qtype, (flat.numel(), self.shape[1]))
        return rows.view(*ids.shape, self.shape[1])

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        return dequantize(self.raw[start:stop], self.qtype, (stop - start, self.shape[1]))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole table (tools and tests; a model never needs it)."""
        return self.dense_rows(0, self.shape[0]).to(dtype)

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def nbytes(self) -> int:
        return self.raw.numel()

    def memory_bytes(self) -> int:
        return self.nbytes()

    def tensors(self) -> list[torch.Tensor]:
        """The tensors it holds (for counting storage)."""
        return [self.raw]

"""The q8 format (GGUF Q8_0, or any weight re-quantized to it) and its rows regrouped 16 at a time (q8g)."""
from __future__ import annotations

import torch

from kernels import cpu_ext, formats
from kernels.formats import GROUP, GROUP_ROWS
from kernels.packed import (check_blocks, groupable, pad_scales, padded_scales, q8_dequantize, q8_group, q8_pack,
                            q8_quantize, q8_ungroup)

from .affine import Q4Linear
from .packed_linear import PackedLinear, prompt_weights, stack_parts, tile_rows
from .superblock import Q4KLinear, Q6Linear


class Q8Linear(PackedLinear):
    """int8 codes with an fp16 scale per 32: w = code * scale (GGUF Q8_0, or quantize() of any weight);
    kept as u8 code + 128 for the kernel.

    group() regroups the rows 16 at a time in place (kernels.packed's q8g: the GEMM tiles' own layout, the same
    bits, no panel to unpack per call; `grouped` says which): for the output head, whose 8-row calls spent
    most of their time unpacking panels. Row access (dense_rows, embedding rows) reads either layout."""

    spec = formats.Q8
    format = spec.name

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, dense: torch.Tensor | None = None,
                 keep_dense: bool = True):
        N, K = codes.shape
        check_blocks(N, K, scale)
        if codes.dtype != torch.int8:
            raise ValueError(f"Q8Linear codes must be int8, got {codes.dtype}")
        self._set(q8_pack(codes), pad_scales(scale), dense, keep_dense)

    @classmethod
    def from_packed(cls, qs: torch.Tensor, scale: torch.Tensor, dense: torch.Tensor | None = None,
                    keep_dense: bool = False) -> "Q8Linear":
        """Adopt ready parts without copies: qs (N, K) uint8 = code + 128, scale from padded_scales()."""
        out = cls.__new__(cls)
        out._set(qs, scale, dense, keep_dense)
        return out

    @classmethod
    def requantize(cls, p: PackedLinear) -> "Q8Linear":
        """Any packed matrix as q8 of its exact weights, a tile of rows at a time (its dense copy kept as is)."""
        N, K = p.shape
        rows = tile_rows(K)
        qs, scale = torch.empty(N, K, dtype=torch.uint8), padded_scales(N, K // GROUP)
        ops = cpu_ext.ops()
        if ops is not None and isinstance(p, Q4Linear):  # kernels/cpu/repack.cpp: same bits, one pass
            ops.q4_to_q8(*p.rows(0, N), qs, scale)
            return cls.from_packed(qs, scale, p.dense, p.dense is not None)
        if ops is not None and isinstance(p, Q6Linear):
            ops.q6_k_to_q8(p.row_blocks().contiguous(), qs, scale)
            return cls.from_packed(qs, scale, p.dense, p.dense is not None)
        if ops is not None and isinstance(p, Q4KLinear):  # through q4, the bits mixed groups had before q4k
            q4 = p.to_q4()
            ops.q4_to_q8(q4.qs, q4.scale, q4.minimum, qs, scale)
            return cls.from_packed(qs, scale, p.dense, p.dense is not None)
        for r0 in range(0, N, rows):
            codes, scale[r0:r0 + rows] = q8_quantize(p.dense_rows(r0, min(r0 + rows, N)))
            qs[r0:r0 + rows] = q8_pack(codes)
        return cls.from_packed(qs, scale, p.dense, p.dense is not None)

    def _set(self, qs: torch.Tensor, scale: torch.Tensor, dense: torch.Tensor | None, keep_dense: bool) -> None:
        self.qs, self.scale = qs, scale  # qs = code + 128: the kernel multiplies u8 by s8
        self.grouped = False
        super().__init__((qs.shape[0], qs.shape[1]), None)
        if keep_dense:
            self.dense = dense if dense is not None else self.dequantize()

    @classmethod
    def quantize(cls, w: torch.Tensor, keep_dense: bool = True) -> "Q8Linear":
        """Symmetric per-32 int8 (GGUF Q8_0's rule); a Q8_0 weight dequantized to fp32 comes back unchanged.
        The dense copy kept is `w` itself (prompt rows stay the checkpoint's own weights)."""
        N, K = w.shape
        if K % GROUP:
            raise ValueError(f"q8 packing needs K % {GROUP} == 0, got {tuple(w.shape)}")
        codes, scale = q8_quantize(w)
        return cls(codes, scale, w.float() if keep_dense else None, keep_dense)

    def group(self) -> bool:
        """Regroup the rows in place where the CPU kernels run, the weights are on the CPU and whole groups fill
        each half (kernels.packed.groupable); whether it is grouped now."""
        if not self.grouped and self.qs.device.type == "cpu" and groupable(self.shape[0]):
            self.qs, self.scale = q8_group(self.qs, self.scale)
            self.grouped = True
        return self.grouped

    def rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(qs, scale) of rows [start, stop) in row order (scale unpadded)."""
        if not self.grouped:
            return self.qs[start:stop], self.scale[start:stop]
        g0 = start // GROUP_ROWS
        qs, scale = q8_ungroup(self.qs[g0:-(-stop // GROUP_ROWS)], self.scale[g0:-(-stop // GROUP_ROWS)])
        lo = start - g0 * GROUP_ROWS
        return qs[lo:lo + stop - start], scale[lo:lo + stop - start]

    @classmethod
    def cat(cls, parts: list["Q8Linear"], consume: bool = False) -> "Q8Linear":
        """Stack along the output dim (fused q|k|v and gate|up): the packed bytes as they are (see stack_parts)."""
        if any(p.grouped for p in parts):
            raise ValueError("grouped q8 matrices are not stacked: stack the rows, then group the result")
        dense, jit = prompt_weights(parts, consume)
        out = cls.from_packed(stack_parts(parts, "qs", consume), pad_scales(stack_parts(parts, "scale", consume)), dense,
                              dense is not None)
        out.jit_dense = jit
        return out

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        return q8_dequantize(*self.rows(start, stop))

    def dense_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        ops = cpu_ext.ops()
        if ops is None or self.grouped:
            return super().dense_into(start, stop, out)
        ops.q8_dequantize_into(self.qs[start:stop], self.scale[start:stop], out)

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.grouped:
            return q8_dequantize(self.qs[ids], self.scale[ids])
        g, r = ids // GROUP_ROWS, ids % GROUP_ROWS
        nb = self.shape[1] // GROUP  # a group's codes are [block][step][row][4 bytes], its scales [block][row]
        qs = self.qs.view(-1, nb, 8, GROUP_ROWS, 4)[g, :, :, r].reshape(ids.numel(), self.shape[1])
        return q8_dequantize(qs, self.scale.view(-1, nb, GROUP_ROWS)[g, :, r])

    @property
    def blocks(self) -> tuple:
        return self.qs, self.scale, None

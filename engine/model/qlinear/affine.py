"""The affine nibble formats, w = code * scale + minimum per 32 weights: q4 (GGUF Q4_0/Q4_1, Q4_K's sub-blocks)
and q5 (GGUF Q5_0/Q5_1), one class of scale-and-minimum code (kernels/cpu/affine.h is the C++ family's)."""
from __future__ import annotations

import torch

from kernels import cpu_ext, formats
from kernels.formats import GROUP, GROUP_ROWS
from kernels.packed import (check_blocks, groupable, int4_available, int4_matmul, int4_weight, pack_nibbles, pad_scales,
                            q4_dequantize, q4_group, q4_supported, q4_ungroup, q5_dequantize, q5_group, q5_pack,
                            q5_ungroup)

from .packed_linear import PackedLinear, prompt_weights, stack_parts


class AffineLinear(PackedLinear):
    """Codes with an fp16 scale and minimum per 32 weights, w = code * scale + minimum: the q4 and q5 formats,
    which differ only in how the codes are laid out (`_codes` packs them, `_decode` gives the weights back,
    `_decode_into` names the C++ decoder, `_weights` is K of a row of codes).

    group() regroups the rows 16 at a time (kernels.packed's q4g and q5g, `_group` / `_ungroup`: the same bits,
    a decode-sized product without the per-row tile's horizontal sums), for the decoder layers' matrices once a
    model is loaded (engine.model.loader.group_matrices); `grouped` says which. Groups whose every minimum is
    -centre * scale (GGUF Q4_0 and Q5_0) drop them (`minimum` None), so the bytes a token reads are the file's;
    Q4_0's then multiply as q8 rows of the same weights (kernels/cpu/affine_groups.h). Row access (rows,
    dense_rows, dense_into, embedding rows) reads either layout."""

    centre: float  # the code the format centres its products on (a Q4_0 / Q5_0 block's minimum is -centre * d)

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, keep_dense: bool = True):
        N, K = codes.shape
        check_blocks(N, K, scale)
        if minimum.shape != scale.shape:
            raise ValueError(f"minimum {tuple(minimum.shape)} must match scale {tuple(scale.shape)}")
        self._set(self._codes(codes).contiguous(), pad_scales(scale), pad_scales(minimum), keep_dense)

    @classmethod
    def from_packed(cls, qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, keep_dense: bool = False):
        """Adopt ready parts without copies: qs in the format's layout, scale and minimum from padded_scales()
        (the loader fills them tile by tile, so no (N, K) code temporaries exist)."""
        out = cls.__new__(cls)
        out._set(qs, scale, minimum, keep_dense)
        return out

    def _set(self, qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, keep_dense: bool) -> None:
        self.qs, self.scale, self.minimum = qs, scale, minimum
        self.grouped = False
        super().__init__((qs.shape[0], self._weights(qs.shape[1])), None)
        if keep_dense:
            self.dense = self.dequantize()

    @classmethod
    def cat(cls, parts: list, consume: bool = False):
        """Stack along the output dim (fused q|k|v and gate|up): the packed bytes as they are (see stack_parts)."""
        if any(p.grouped for p in parts):
            raise ValueError(f"grouped {cls.format} matrices are not stacked: stack the rows, then group the result")
        dense, jit = prompt_weights(parts, consume)
        out = cls.from_packed(stack_parts(parts, "qs", consume), pad_scales(stack_parts(parts, "scale", consume)),
                              pad_scales(stack_parts(parts, "minimum", consume)))
        out.dense, out.jit_dense = dense, jit
        return out

    def rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(qs, scale, minimum) of rows [start, stop) in row order (scales unpadded)."""
        if not self.grouped:
            return self.qs[start:stop], self.scale[start:stop], self.minimum[start:stop]
        g0, g1 = start // GROUP_ROWS, -(-stop // GROUP_ROWS)
        lo = start - g0 * GROUP_ROWS
        return tuple(t[lo:lo + stop - start] for t in self._ungroup(self.qs[g0:g1], self.scale[g0:g1],
                                                                    self._minimums(slice(g0, g1))))

    def _minimums(self, groups) -> torch.Tensor:
        """The minimums of `groups` (an index into the groups), -centre * scale where the groups dropped them
        (exact: the centre is a power of two)."""
        if self.minimum is not None:
            return self.minimum[groups]
        return (self.scale[groups].float() * -self.centre).half()

    def group(self) -> bool:
        """Regroup the rows where the format's group kernel is vectorized, the weights are on the CPU and whole
        groups fill each half (kernels.packed.groupable); whether it is grouped now."""
        if not self.grouped and self.qs.device.type == "cpu" and groupable(self.shape[0], self.spec.grouped_id):
            self.qs, self.scale, self.minimum = self._group(self.qs, self.scale, self.minimum)
            self.grouped = True
            if cpu_ext.ops().centred_minimums(self.scale, self.minimum, self.centre):
                self.minimum = None
        return self.grouped

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        return self._decode(*self.rows(start, stop))

    def dense_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        ops = cpu_ext.ops()
        if ops is None:
            return super().dense_into(start, stop, out)
        if self.grouped:  # read where they lie: a prompt chunk decodes every matrix, ungrouping them cost a third more
            minimum = self.minimum if self.minimum is not None else self.scale.new_empty(0)
            return getattr(ops, self._decode_groups_into)(self.qs, self.scale, minimum, start, stop, out)
        getattr(ops, self._decode_into)(*self.rows(start, stop), out)

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.grouped:
            return self._decode(self.qs[ids], self.scale[ids], self.minimum[ids])
        groups, inverse = torch.unique(ids // GROUP_ROWS, return_inverse=True)  # the ids' groups, as rows
        at = inverse * GROUP_ROWS + ids % GROUP_ROWS
        qs, scale, minimum = self._ungroup(self.qs[groups], self.scale[groups], self._minimums(groups))
        return self._decode(qs[at], scale[at], minimum[at])

    @property
    def blocks(self) -> tuple:
        return self.qs, self.scale, self.minimum


class Q4Linear(AffineLinear):
    """4-bit codes (GGUF nibble order) with fp16 scale and minimum per 32 (engine.model.packing.repack reads them from
    GGUF Q4_0/Q4_1 blocks without rounding, from Q4_K with fp16-rounded sub-block scales); grouped in place (q4g)."""

    spec = formats.Q4
    format = spec.name
    centre = 8.0
    _codes, _decode, _decode_into = staticmethod(pack_nibbles), staticmethod(q4_dequantize), "q4_dequantize_into"
    _group, _ungroup, _decode_groups_into = staticmethod(q4_group), staticmethod(q4_ungroup), "q4g_dequantize_into"

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, keep_dense: bool = True):
        if not q4_supported():
            raise RuntimeError("no 4-bit matmul here (pagedeck's CPU kernels did not build and this torch has no "
                               "_weight_int4pack_mm_for_cpu); load the model with weights='dense'")
        super().__init__(codes, scale, minimum, keep_dense)

    @staticmethod
    def _weights(code_bytes: int) -> int:
        return code_bytes * 2

    def _set(self, qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, keep_dense: bool) -> None:
        self._int4 = None  # torch's packing, built only if the fallback runs
        super()._set(qs, scale, minimum, keep_dense)

    def _fallback(self, x: torch.Tensor) -> torch.Tensor:
        if not int4_available() or x.device.type != "cpu":
            return super()._fallback(x)
        if self._int4 is None:
            self._int4 = int4_weight(*self.rows(0, self.shape[0]))
        return int4_matmul(x, self._int4)


class Q5Linear(AffineLinear):
    """5-bit codes with fp16 scale and minimum per 32: GGUF Q5_0 (minimum -16 d) and Q5_1 held exactly at 5 bits
    a weight (as q8 they took 8.5); kernels.packed.q5_layout is the byte order. Without the CPU kernels its
    products take dense rows."""

    spec = formats.Q5
    format = spec.name
    centre = 16.0
    _codes, _decode, _decode_into = staticmethod(q5_pack), staticmethod(q5_dequantize), "q5_dequantize_into"
    _group, _ungroup, _decode_groups_into = staticmethod(q5_group), staticmethod(q5_ungroup), "q5g_dequantize_into"

    @staticmethod
    def _weights(code_bytes: int) -> int:
        return code_bytes // Q5Linear.spec.code_bytes * GROUP

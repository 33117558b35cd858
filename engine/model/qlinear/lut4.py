"""The 4-bit lookup-table formats kept as the file stores them: mxfp4 (GGUF MXFP4, gpt-oss's experts), iq4nl
(GGUF IQ4_NL) and iq4xs (GGUF IQ4_XS): 4-bit codes into a 16-entry table, one exact scale per 32 weights inside
the blocks (kernels/cpu/lut4.h is the C++ family's)."""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from kernels import formats
from kernels.packed import NO_SCALES

from ..ggml_blocks import dequantize
from .packed_linear import PackedLinear, prompt_weights, stack_parts


class Lut4Linear(PackedLinear):
    """Rows of the file's blocks (spec.code_bytes bytes a spec.values weights), decoded exactly as gguf does;
    the kernels look each code up in the format's table and multiply as q8 (kernels/cpu/lut4.h). As q8 these
    matrices took 8.5 bits a weight; kept, 4.25 (mxfp4, iq4xs) or 4.5 (iq4nl)."""

    QTYPE: GGMLQuantizationType

    def __init__(self, qs: torch.Tensor, dense: torch.Tensor | None = None):
        n, row_bytes = qs.shape
        if qs.dtype != torch.uint8 or row_bytes % self.spec.code_bytes:
            raise ValueError(f"{self.format} rows must be uint8 {self.QTYPE.name} blocks ({self.spec.code_bytes} "
                             f"bytes each), got {qs.dtype} {tuple(qs.shape)}")
        self.qs = qs.contiguous()
        super().__init__((n, row_bytes // self.spec.code_bytes * self.spec.values), dense)

    @classmethod
    def cat(cls, parts: list["Lut4Linear"], consume: bool = False) -> "Lut4Linear":
        """Stack along the output dim: the blocks as they are (see stack_parts)."""
        dense, jit = prompt_weights(parts, consume)
        out = cls(stack_parts(parts, "qs", consume), dense)
        out.jit_dense = jit
        return out

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        return dequantize(self.qs[start:stop], self.QTYPE, (stop - start, self.shape[1]))

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize(self.qs[ids], self.QTYPE, (ids.numel(), self.shape[1]))

    @property
    def blocks(self) -> tuple:
        return self.qs, NO_SCALES, None


class MXFP4Linear(Lut4Linear):
    """GGUF MXFP4 blocks: w = kvalues_mxfp4[code] * 2^(e - 128), one E8M0 exponent byte e a 32 weights (its
    range, 2^-128..2^127, is beyond fp16: the byte is kept)."""

    spec = formats.MXFP4
    format = spec.name
    QTYPE = GGMLQuantizationType.MXFP4


class IQ4NLLinear(Lut4Linear):
    """GGUF IQ4_NL blocks: w = d * kvalues_iq4nl[code], fp16 d a 32 weights."""

    spec = formats.IQ4NL
    format = spec.name
    QTYPE = GGMLQuantizationType.IQ4_NL


class IQ4XSLinear(Lut4Linear):
    """GGUF IQ4_XS super-blocks: w = d * (ls - 32) * kvalues_iq4nl[code], fp16 d a 256 weights and a 6-bit ls a
    32."""

    spec = formats.IQ4XS
    format = spec.name
    QTYPE = GGMLQuantizationType.IQ4_XS


LUT4_CLASSES: dict[str, type[Lut4Linear]] = {c.format: c for c in (MXFP4Linear, IQ4NLLinear, IQ4XSLinear)}

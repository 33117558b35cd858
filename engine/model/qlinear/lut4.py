"""The blocks-as-stored formats whose values are int8 codes: the 4-bit lookup-table ones, mxfp4 (GGUF MXFP4,
gpt-oss's experts), iq4nl (GGUF IQ4_NL) and iq4xs (GGUF IQ4_XS), 4-bit codes into a 16-entry table, and q8s
(GGUF Q8_0 as stored, what a model starts on before its Q8_0 blocks move into q8's layout); one exact scale per 32
weights inside the blocks (kernels/cpu/lut4.h is the C++ family's)."""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from kernels import formats

from .superblock import SuperBlockLinear


class Lut4Linear(SuperBlockLinear):
    """Rows of the file's blocks (spec.code_bytes bytes a spec.values weights), decoded exactly as gguf does;
    the kernels look each code up in the format's table and multiply as q8 (kernels/cpu/lut4.h). As q8 these
    matrices took 8.5 bits a weight; kept, 4.25 (mxfp4, iq4xs) or 4.5 (iq4nl). IQ4_XS rows are regrouped 16 at
    a time where the group kernel is built (iq4xs16, kernels/cpu/iq4xs16.h), as the K-quants' are."""

    QTYPE: GGMLQuantizationType


class MXFP4Linear(Lut4Linear):
    """GGUF MXFP4 blocks: w = kvalues_mxfp4[code] * 2^(e - 128), one E8M0 exponent byte e a 32 weights (its
    range, 2^-128..2^127, is beyond fp16: the byte is kept)."""

    spec = formats.MXFP4
    format = spec.name
    BLOCK_BYTES = spec.code_bytes
    QTYPE = GGMLQuantizationType.MXFP4


class IQ4NLLinear(Lut4Linear):
    """GGUF IQ4_NL blocks: w = d * kvalues_iq4nl[code], fp16 d a 32 weights."""

    spec = formats.IQ4NL
    format = spec.name
    BLOCK_BYTES = spec.code_bytes
    QTYPE = GGMLQuantizationType.IQ4_NL


class IQ4XSLinear(Lut4Linear):
    """GGUF IQ4_XS super-blocks: w = d * (ls - 32) * kvalues_iq4nl[code], fp16 d a 256 weights and a 6-bit ls a
    32."""

    spec = formats.IQ4XS
    format = spec.name
    BLOCK_BYTES = spec.code_bytes
    QTYPE = GGMLQuantizationType.IQ4_XS
    GROUPS = True


class Q8SLinear(Lut4Linear):
    """GGUF Q8_0 blocks as the file stores them: w = d * q, fp16 d and 32 int8 codes q a 32 weights. A model on
    its mapped file reads these (keep_rows, views of the file) until settling has moved them into q8's layout
    (Q8Linear: codes + 128, scales apart), whose bits these kernels give (kernels/cpu/lut4.h)."""

    spec = formats.Q8S
    format = spec.name
    BLOCK_BYTES = spec.code_bytes
    QTYPE = GGMLQuantizationType.Q8_0


LUT4_CLASSES: dict[str, type[Lut4Linear]] = {c.format: c for c in (MXFP4Linear, IQ4NLLinear, IQ4XSLinear, Q8SLinear)}

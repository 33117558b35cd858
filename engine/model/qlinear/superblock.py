"""The K-quant formats kept as the file stores them: q6 (GGUF Q6_K), q4k (GGUF Q4_K), q5k (GGUF Q5_K) and q3k
(GGUF Q3_K), each in rows or regrouped 16 at a time, and q2k (GGUF Q2_K) in rows; and q5s, GGUF Q5_0's blocks
as stored, what a model starts on before they move into q5's layout."""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from kernels import cpu_ext, formats
from kernels.formats import GROUP, GROUP_ROWS
from kernels.packed import NO_SCALES, group_superblocks, groupable, padded_scales, superblock_rows

from ..ggml_blocks import dequantize
from .affine import Q4Linear
from .packed_linear import PackedLinear, prompt_weights, stack_parts


class SuperBlockLinear(PackedLinear):
    """A GGUF type kept as the file stores it: rows of BLOCK_BYTES-byte blocks of spec.values weights each (the
    K-quants' super-blocks, the lookup-table family's blocks: lut4.py), their scales inside the blocks, decoded
    exactly as gguf does.

    A format with GROUPS (q4k, q5k, q6, iq4xs) keeps, where its group kernel is built and N % 32 == 0
    (kernels.packed.groupable), its rows regrouped 16 at a time in `qs` (kernels.packed's q4k16, q5k16, q6k16 and
    iq4xs16: the same bytes, the same bits, kernels without horizontal reductions); `grouped` says which. Give rows,
    or groups with grouped=True (the loader writes the file's rows straight into groups,
    kernels.packed.group_superblocks). keep_rows=True keeps given rows as they are, never copied into groups (a
    model's first seconds on its mapped file, engine.model.settle: `qs` is then a view of the file).
    """

    format: str
    BLOCK_BYTES: int
    QTYPE: GGMLQuantizationType
    GROUPS = False

    def __init__(self, qs: torch.Tensor, dense: torch.Tensor | None = None, grouped: bool = False,
                 keep_rows: bool = False):
        n, row_bytes = qs.shape
        if grouped:
            n, row_bytes = n * GROUP_ROWS, row_bytes // GROUP_ROWS
        if qs.dtype != torch.uint8 or row_bytes % self.BLOCK_BYTES or (grouped and qs.shape[1] % GROUP_ROWS):
            raise ValueError(f"{self.format} {'groups' if grouped else 'rows'} must be uint8 {self.QTYPE.name} "
                             f"blocks ({self.BLOCK_BYTES} bytes each{', 16 rows a group' if grouped else ''}), "
                             f"got {qs.dtype} {tuple(qs.shape)}")
        self.qs, self.grouped = qs.contiguous(), grouped
        super().__init__((n, row_bytes // self.BLOCK_BYTES * self.spec.values), dense)
        if not grouped and not keep_rows and self.GROUPS and groupable(n, self.spec.grouped_id):
            groups = self.empty_groups(n, self.shape[1])
            group_superblocks(self.qs, groups, self.BLOCK_BYTES)
            self.qs, self.grouped = groups, True

    @classmethod
    def empty_groups(cls, n: int, k: int) -> torch.Tensor:
        """Uninitialized groups for n rows of k weights (n % 16 == 0), for the loader to fill."""
        return torch.empty(cls.spec.qs_shape(n, k, grouped=True), dtype=torch.uint8)

    def row_blocks(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows [start, stop) as the file's super-block rows (ungrouped where they are kept in groups)."""
        stop = self.shape[0] if stop is None else stop
        if not self.grouped:
            return self.qs[start:stop]
        g0 = start // GROUP_ROWS
        rows = superblock_rows(self.qs[g0:-(-stop // GROUP_ROWS)], self.BLOCK_BYTES)
        return rows[start - g0 * GROUP_ROWS: stop - g0 * GROUP_ROWS]

    @classmethod
    def cat(cls, parts: list["SuperBlockLinear"], consume: bool = False) -> "SuperBlockLinear":
        """Stack along the output dim: the super-blocks as they are (see stack_parts), groups where every part is
        grouped, else the parts' rows."""
        dense, jit = prompt_weights(parts, consume)
        if all(p.grouped for p in parts):
            out = cls(stack_parts(parts, "qs", consume), dense, grouped=True)
        else:
            out = cls(torch.cat([p.row_blocks() for p in parts]), dense)
        out.jit_dense = jit
        return out

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        return dequantize(self.row_blocks(start, stop), self.QTYPE, (stop - start, self.shape[1]))

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        if self.grouped:
            groups, inverse = torch.unique(ids // GROUP_ROWS, return_inverse=True)
            rows = superblock_rows(self.qs[groups], self.BLOCK_BYTES)[inverse * GROUP_ROWS + ids % GROUP_ROWS]
        else:
            rows = self.qs[ids]
        return dequantize(rows, self.QTYPE, (ids.numel(), self.shape[1]))

    @property
    def blocks(self) -> tuple:
        return self.qs, NO_SCALES, None


class Q6Linear(SuperBlockLinear):
    """GGUF Q6_K super-blocks (kernels.packed's q6, or q6k16 in groups): w = d * sc * (code - 32), 6.56 bits a
    weight (as q8 they took 8.5)."""

    spec = formats.Q6
    format = spec.name
    BLOCK_BYTES = spec.code_bytes
    QTYPE = GGMLQuantizationType.Q6_K
    GROUPS = True


class Q3KLinear(SuperBlockLinear):
    """GGUF Q3_K super-blocks (kernels.packed's q3k): w = d * sc * (code - 4), codes 0..7 and sixteen 6-bit
    scales less 32, 3.44 bits a weight (as q8 they took 8.5: a Q3_K_M file held ~2x its size). Multiplied by q6's
    kernels read through Q3_K's layout (kernels/cpu/q6.h), or in 16-row groups q3k16 (kernels/cpu/q3k16.h)."""

    spec = formats.Q3K
    format = spec.name
    BLOCK_BYTES = spec.code_bytes
    QTYPE = GGMLQuantizationType.Q3_K
    GROUPS = True


class Q2KLinear(SuperBlockLinear):
    """GGUF Q2_K super-blocks (kernels.packed's q2k): w = d * sc * code - dmin * m, codes 0..3, a 4-bit scale and
    minimum per 16 weights, 2.63 bits a weight (as q8 they took 8.5: a Q2_K file held ~3x its size). Multiplied by
    q6's kernels read through Q2_K's layout, its minimums as q4k's (kernels/cpu/q6.h), in rows."""

    spec = formats.Q2K
    format = spec.name
    BLOCK_BYTES = spec.code_bytes
    QTYPE = GGMLQuantizationType.Q2_K


class Q4KLinear(SuperBlockLinear):
    """GGUF Q4_K super-blocks (kernels.packed's q4k): w = d * sc * code - dmin * m, 4.5 bits a weight (as q4
    they took 5, with fp16-rounded d * sc and dmin * m). Multiplied as llama.cpp's Q4_K x Q8_K: activations
    quantized per 256, the 6-bit scales and minimums applied as integers (kernels/cpu/q4k.h)."""

    spec = formats.Q4K
    format = spec.name
    BLOCK_BYTES = spec.code_bytes
    QTYPE = GGMLQuantizationType.Q4_K
    GROUPS = True

    def to_q4(self) -> Q4Linear:
        """As q4 (fp16 d*sc and -dmin*m per 32; kernels/cpu/repack.cpp's q4_k_repack): for groups fused with
        Q4_0/Q4_1 parts, and on the way to q8."""
        N, K = self.shape
        qs, scale, minimum = torch.empty(N, K // 2, dtype=torch.uint8), padded_scales(N, K // GROUP), padded_scales(N, K // GROUP)
        cpu_ext.ops().q4_k_repack(self.row_blocks().contiguous(), qs, scale, minimum)
        out = Q4Linear.from_packed(qs, scale, minimum)
        out.dense = self.dense
        return out


class Q5KLinear(SuperBlockLinear):
    """GGUF Q5_K super-blocks (kernels.packed's q5k): Q4_K's scales and nibbles plus a plane of fifth bits, w =
    d * sc * code - dmin * m with codes 0..31, 5.5 bits a weight (as q8 they took 8.5). Multiplied by q4k's
    kernels read through Q5_K's layout (kernels/cpu/q4k.h), or in 16-row groups q5k16 (kernels/cpu/q5k16.h)."""

    spec = formats.Q5K
    format = spec.name
    BLOCK_BYTES = spec.code_bytes
    QTYPE = GGMLQuantizationType.Q5_K
    GROUPS = True


class Q5SLinear(SuperBlockLinear):
    """GGUF Q5_0 blocks as the file stores them: w = d * (q - 16), fp16 d, 32 fifth bits and 16 nibble bytes a 32
    weights. A model on its mapped file reads these (keep_rows, views of the file) until settling has moved them
    into q5's layout (Q5Linear: pairs of blocks, scales apart); q5's kernels read them with m = -16 d, so with
    q5's bits (kernels/cpu/affine.h)."""

    spec = formats.Q5S
    format = spec.name
    BLOCK_BYTES = spec.code_bytes
    QTYPE = GGMLQuantizationType.Q5_0


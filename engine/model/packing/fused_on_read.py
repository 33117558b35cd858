"""Fused q|k|v and gate|up matrices whose parts all share one ggml type the kernels hold exactly and cheaply
(Q4_K, Q5_K, Q6_K, IQ4_XS and the other types kept as the file's blocks; Q5_0 / Q5_1 as q5; Q8_0 as q8), written
straight into the fused matrix.

Packing each part on its own and then stacking the parts (engine.model.qlinear.cat_packed) writes every byte
of the fused matrices a second time, and the scales of q5 and q8 twice more (stacked, then padded): gate|up
alone is 60 MB a layer of an 8B-shaped Q4_K_M file, and a Gemma-3-270M-shaped file's 640-wide q/k/gate/up are
Q5_0 (llama.cpp's fallback for K-quants on rows that are no multiple of 256). Here the fused matrix (its
codes, and its padded scales where the format has them) is allocated once and each part's blocks are written
once from the mapped file into their rows: super-blocks as they are (into their groups of 16 rows where the
build has the format's group kernel), Q5 / Q8_0 blocks through the C++ repackers (repack_fast.tile_into). The
bits are those of packing the parts and stacking them.

Mixed groups (a Q4_K_M file's Q4_K q/k beside a Q6_K v) and models keeping a dense copy still go through
cat_packed: which format a mixed group becomes is its rule.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from kernels import cpu_ext
from kernels.formats import GROUP, GROUP_ROWS, Q5
from kernels.packed import groupable, padded_scales

from ..qlinear import Q5Linear, Q8Linear, SuperBlockLinear
from . import move_queue, repack_fast
from .repack import block_class, kernel_format
from .readahead import read_ahead

Q = GGMLQuantizationType

FUSED_NAMES = {("q_proj.weight", "k_proj.weight", "v_proj.weight"): "qkv_proj.weight",
               ("gate_proj.weight", "up_proj.weight"): "gate_up_proj.weight"}


class FusedSuperBlocks:
    """One fused matrix kept as the file's blocks (cls: repack.block_class's, e.g. Q4KLinear, Q6Linear) being
    written: its parts' rows, in group order, as the file's tensors arrive."""

    def __init__(self, name: str, parts: list[str], rows: list[int], k: int, cls: type[SuperBlockLinear]):
        self.name, self.parts, self.cls = name, parts, cls
        self.offsets = dict(zip(parts, [sum(rows[:i]) for i in range(len(rows) + 1)]))
        self.ends = {p: self.offsets[p] + r for p, r in zip(parts, rows)}
        # groups of 16 rows where every part is whole groups (each part's rows written as its own groups)
        self.grouped = cls.GROUPS and all(groupable(r, cls.spec.grouped_id) for r in rows)
        n = sum(rows)
        self.qs = torch.empty(cls.spec.qs_shape(n, k, self.grouped), dtype=torch.uint8)
        self.todo = set(parts)

    def write(self, part: str, raw: torch.Tensor) -> SuperBlockLinear | None:
        """Copy the part's rows `raw` (the file's super-blocks) into its rows; the fused matrix once every part is
        written."""
        r0, r1 = self.offsets[part], self.ends[part]
        read_ahead(raw)
        if self.grouped:
            move_queue.group(raw.reshape(r1 - r0, -1), self.qs[r0 // GROUP_ROWS:r1 // GROUP_ROWS],
                              self.cls.BLOCK_BYTES)
        else:
            move_queue.copy(raw.reshape(r1 - r0, -1), self.qs[r0:r1])
        self.todo.discard(part)
        return None if self.todo else self.cls(self.qs, grouped=self.grouped)


class FusedRows:
    """One fused q5 (Q5_0 / Q5_1 parts) or q8 (Q8_0 parts) matrix being written: codes and padded scales
    allocated once for every part's rows, each part repacked into its rows as the file's tensors arrive."""

    def __init__(self, name: str, parts: list[str], rows: list[int], k: int, qtype: GGMLQuantizationType):
        self.name, self.parts, self.qtype = name, parts, qtype
        self.offsets = dict(zip(parts, [sum(rows[:i]) for i in range(len(rows) + 1)]))
        self.ends = {p: self.offsets[p] + r for p, r in zip(parts, rows)}
        n, g = sum(rows), k // GROUP
        self.q8 = qtype == Q.Q8_0
        self.qs = torch.empty(n, k if self.q8 else Q5.row_bytes(k), dtype=torch.uint8)
        self.scale = padded_scales(n, g)
        self.minimum = None if self.q8 else padded_scales(n, g)
        self.todo = set(parts)

    def write(self, part: str, raw: torch.Tensor) -> Q5Linear | Q8Linear | None:
        """Repack the part's rows `raw` (ggml blocks) into its rows; the fused matrix once every part is written."""
        r0, r1 = self.offsets[part], self.ends[part]
        read_ahead(raw)
        minimum = None if self.q8 else self.minimum[r0:r1]
        if not repack_fast.tile_into(raw.reshape(r1 - r0, -1), self.qtype, "q8" if self.q8 else "q5", self.qs[r0:r1],
                                     self.scale[r0:r1], minimum):
            raise RuntimeError("the C++ repackers are not built (plan() fuses nothing then)")
        self.todo.discard(part)
        if self.todo:
            return None
        if self.q8:
            return Q8Linear.from_packed(self.qs, self.scale)
        return Q5Linear.from_packed(self.qs, self.scale, self.minimum)


_REPACKED = (Q.Q5_0, Q.Q5_1, Q.Q8_0)  # written through repack_fast.tile_into (FusedRows)


def plan(stored: dict[str, tuple[GGMLQuantizationType, tuple[int, ...]]], fmt: str,
         keep_dense: bool) -> dict[str, FusedSuperBlocks | FusedRows]:
    """{part's HF name: the fused matrix it is written into} for every q|k|v and gate|up group of `stored`
    (HF name -> (ggml type, shape)) whose parts are all of one type kept as the file's blocks (Q4_K, Q5_K, Q6_K,
    IQ4_XS, ...: repack.block_class), all Q5_0 or Q5_1 (-> q5) or all Q8_0 (-> q8); empty where the kernels are
    not built, where a dense copy is kept or for unfused layouts."""
    if keep_dense or fmt != "packed" or cpu_ext.ops() is None:
        return {}
    out: dict[str, FusedSuperBlocks | FusedRows] = {}
    for name in stored:
        for group, fused in FUSED_NAMES.items():
            if not name.endswith(group[0]):
                continue
            prefix = name[: -len(group[0])]
            parts = [prefix + p for p in group]
            if not all(p in stored for p in parts):
                continue
            types = {stored[p][0] for p in parts}
            shapes = [stored[p][1] for p in parts]
            k = shapes[0][-1]
            if len(types) != 1 or any(len(s) != 2 or s[1] != k for s in shapes):
                continue
            qtype, rows = types.pop(), [s[0] for s in shapes]
            cls = block_class(kernel_format(qtype.name, fmt))
            if cls is not None and k % cls.spec.values == 0:  # kept as the file's blocks
                target = FusedSuperBlocks(prefix + fused, parts, rows, k, cls)
            elif qtype in _REPACKED and k % GROUP == 0:
                target = FusedRows(prefix + fused, parts, rows, k, qtype)
            else:
                continue
            out.update({p: target for p in parts})
    return out

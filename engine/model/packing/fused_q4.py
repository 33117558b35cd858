"""Fused q|k|v and gate|up matrices whose parts are all Q4_K, written straight into the fused q4k matrix.

The loader used to pack each part on its own and then stack the parts (engine.model.qlinear.cat_packed): a
second write of every byte of the fused matrices (gate|up alone is 60 MB a layer of an 8B-shaped Q4_K_M
file). Here each part's super-blocks (q4k keeps the file's Q4_K bytes) are copied once from the mapped
file into their rows of the fused matrix (into their groups of 16 rows where the kernels run), allocated once.
The bits are those of packing the parts and stacking them.

Mixed groups (a Q4_K_M file's Q4_K q/k beside a Q6_K v) and models keeping a dense copy still go through
cat_packed: which format a mixed group becomes is its rule.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from kernels import cpu_ext
from kernels.formats import GROUP_ROWS, Q4K
from kernels.packed import group_superblocks, groupable

from ..qlinear import Q4KLinear

FUSED_NAMES = {("q_proj.weight", "k_proj.weight", "v_proj.weight"): "qkv_proj.weight",
               ("gate_proj.weight", "up_proj.weight"): "gate_up_proj.weight"}


class FusedQ4:
    """One fused matrix being written: its parts' rows, in group order, as the file's tensors arrive."""

    def __init__(self, name: str, parts: list[str], rows: list[int], k: int):
        self.name, self.parts = name, parts
        self.offsets = dict(zip(parts, [sum(rows[:i]) for i in range(len(rows) + 1)]))
        self.ends = {p: self.offsets[p] + r for p, r in zip(parts, rows)}
        # groups of 16 rows where every part is whole groups (each part's rows written as its own groups)
        self.grouped = all(groupable(r) for r in rows)
        self.qs = (Q4KLinear.empty_groups(sum(rows), k) if self.grouped
                   else torch.empty(Q4K.qs_shape(sum(rows), k), dtype=torch.uint8))
        self.todo = set(parts)

    def write(self, part: str, raw: torch.Tensor) -> Q4KLinear | None:
        """Copy the part's Q4_K rows `raw` into its rows; the fused matrix once every part is written."""
        r0, r1 = self.offsets[part], self.ends[part]
        if self.grouped:
            group_superblocks(raw.reshape(r1 - r0, -1), self.qs[r0 // GROUP_ROWS:r1 // GROUP_ROWS],
                              Q4K.code_bytes)
        else:
            self.qs[r0:r1] = raw.reshape(r1 - r0, -1)
        self.todo.discard(part)
        return None if self.todo else Q4KLinear(self.qs, grouped=self.grouped)


def plan(stored: dict[str, tuple[GGMLQuantizationType, tuple[int, ...]]], fmt: str,
         keep_dense: bool) -> dict[str, FusedQ4]:
    """{part's HF name: the fused matrix it is written into} for every q|k|v and gate|up group of `stored`
    (HF name -> (ggml type, shape)) whose parts all pack as Q4_K -> q4k; empty
    where the kernels are not built, where a dense copy is kept or for unfused layouts."""
    if keep_dense or fmt != "packed" or cpu_ext.ops() is None:
        return {}
    out: dict[str, FusedQ4] = {}
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
            if types != {GGMLQuantizationType.Q4_K} or k % 256 or any(len(s) != 2 or s[1] != k for s in shapes):
                continue
            target = FusedQ4(prefix + fused, parts, [s[0] for s in shapes], k)
            out.update({p: target for p in parts})
    return out

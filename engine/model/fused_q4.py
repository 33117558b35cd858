"""Fused q|k|v and gate|up matrices whose parts are all Q4_K, repacked straight into the fused q4 matrix.

The loader used to pack each part on its own and then stack the parts (engine.model.qlinear.cat_packed):
a second write of every byte of the fused matrices (~0.5 s of CPU on an 8-layer 8B-shaped Q4_K_M file,
its gate|up alone 60 MB a layer) and a zero-filled scale buffer per part. Here the C++ repacker
(kernels/cpu/repack.cpp's q4_k_repack, the one engine.model.repack_fast calls) writes each part into its
rows of the fused codes and scales, allocated once; only the scale buffers' SCALE_PAD tail is zeroed (the
repacker writes every other byte). The bits are those of packing the parts and stacking them.

Mixed groups (a Q4_K_M file's Q4_K q/k beside a Q6_K v) and models keeping a dense copy still go through
cat_packed: which format a mixed group becomes is its rule.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from kernels import cpu_ext
from kernels.packed import GROUP, SCALE_PAD

from .qlinear import Q4Linear

FUSED_NAMES = {("q_proj.weight", "k_proj.weight", "v_proj.weight"): "qkv_proj.weight",
               ("gate_proj.weight", "up_proj.weight"): "gate_up_proj.weight"}


def _scales(n: int, groups: int) -> torch.Tensor:
    """fp16 (n, groups) scales in a buffer SCALE_PAD values longer (kernels.packed.padded_scales' layout),
    only the padding zeroed: the repacker writes every scale."""
    buf = torch.empty(n * groups + SCALE_PAD, dtype=torch.float16)
    buf[n * groups:] = 0
    return buf[: n * groups].view(n, groups)


class FusedQ4:
    """One fused matrix being written: its parts' rows, in group order, as the file's tensors arrive."""

    def __init__(self, name: str, parts: list[str], rows: list[int], k: int):
        self.name, self.parts = name, parts
        self.offsets = dict(zip(parts, [sum(rows[:i]) for i in range(len(rows) + 1)]))
        self.ends = {p: self.offsets[p] + r for p, r in zip(parts, rows)}
        n = sum(rows)
        self.qs = torch.empty(n, k // 2, dtype=torch.uint8)
        self.scale, self.minimum = _scales(n, k // GROUP), _scales(n, k // GROUP)
        self.todo = set(parts)

    def write(self, part: str, raw: torch.Tensor) -> Q4Linear | None:
        """Repack the part's Q4_K rows `raw` into its rows; the fused matrix once every part is written."""
        r0, r1 = self.offsets[part], self.ends[part]
        cpu_ext.ops().q4_k_repack(raw.contiguous(), self.qs[r0:r1], self.scale[r0:r1], self.minimum[r0:r1])
        self.todo.discard(part)
        return None if self.todo else Q4Linear.from_packed(self.qs, self.scale, self.minimum)


def plan(stored: dict[str, tuple[GGMLQuantizationType, tuple[int, ...]]], fmt: str,
         keep_dense: bool) -> dict[str, FusedQ4]:
    """{part's HF name: the fused matrix it is written into} for every q|k|v and gate|up group of `stored`
    (HF name -> (ggml type, shape)) whose parts all pack as Q4_K -> q4 through the C++ repacker; empty
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

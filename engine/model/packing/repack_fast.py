"""Loading GGUF matrices straight into the packed formats with pagedeck's C++ repackers
(kernels/cpu/repack.cpp): Q4_K -> q4 and (under weights="q8"; "packed" keeps Q6_K as q6, a copy) Q6_K -> q8 in
one parallel pass over the file's bytes, written into the final tensors; Q8_0 -> q8, Q5_0/Q5_1 -> q5 and
Q4_0/Q4_1 -> q4 a tile of rows at a time (tile_into), their exact codes and scales moved. The torch route (engine.model.packing.repack.q4_parts, ggml_blocks' decoders + q8_quantize) built
every tile through several whole-tile temporaries and took most of an 8B Q4_K_M file's load time; both give
the same bits (tests/engine/test_repack_fast.py). None where the kernels are not built: repack's torch route.
"""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from kernels import cpu_ext
from kernels.packed import padded_scales

from ..qlinear import PackedLinear, Q4Linear, Q8Linear
from . import move_queue

Q = GGMLQuantizationType


def pack(rows: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int], kernel: str) -> PackedLinear | None:
    """The (N, K) matrix in ggml bytes `rows` as kernel format `kernel` ("q4" or "q8"), or None where no C++
    repacker covers this type and format (or the kernels are not built)."""
    n, k = shape
    if k % 256 or (qtype, kernel) not in ((Q.Q4_K, "q4"), (Q.Q6_K, "q8")):
        return None
    ops = cpu_ext.ops()
    if ops is None:
        return None
    raw = rows.contiguous()
    scale = padded_scales(n, k // 32)
    if qtype == Q.Q4_K:
        qs, minimum = torch.empty(n, k // 2, dtype=torch.uint8), padded_scales(n, k // 32)
        ops.q4_k_repack(raw, qs, scale, minimum)
        return Q4Linear.from_packed(qs, scale, minimum)
    qs = torch.empty(n, k, dtype=torch.uint8)
    ops.q6_k_to_q8(raw, qs, scale)
    return Q8Linear.from_packed(qs, scale)


_TILE_REPACKERS = {(Q.Q8_0, "q8"), (Q.Q5_0, "q5"), (Q.Q5_1, "q5"), (Q.Q4_0, "q4"), (Q.Q4_1, "q4")}


def tile_into(tile: torch.Tensor, qtype: GGMLQuantizationType, kind: str, qs: torch.Tensor, scale: torch.Tensor,
              minimum: torch.Tensor | None = None) -> bool:
    """Rows of Q8_0 blocks into q8's qs and scale, of Q5_0/Q5_1 or Q4_0/Q4_1 blocks into q5's or q4's qs, scale
    and minimum (`kind`: the format written), in place with the C++ repackers; False where they do not cover the
    type and format or are not built (repack's torch route then writes the same bits)."""
    ops = cpu_ext.ops()
    if ops is None or (qtype, kind) not in _TILE_REPACKERS:
        return False
    move_queue.repack(tile, qtype.name, qs, scale, minimum)
    return True

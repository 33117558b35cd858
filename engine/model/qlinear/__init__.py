"""Packed (quantized) linear weights: one interface, one kernel per format.

Decode on a CPU is bound by weight bytes: fp32 copies of the default model's Q4_1 layers are 540 MB a
token, their 4-bit blocks ~70 MB. The formats ("q4": GGUF Q4_1/Q4_0, Q4_K's sub-blocks via
engine.model.packing.repack; "q5": GGUF Q5_0/Q5_1; "q6": GGUF Q6_K's own super-blocks; "q4k": GGUF Q4_K's own
super-blocks; "q8": GGUF Q8_0, or any other weight quantized to it at load), their layouts and the kernel that
multiplies them are kernels.packed's (kernels.formats their table); this package is the nn-level use of them.
Without pagedeck's CPU kernels q4 falls back to torch's int4 kernel (bf16 activations), q5, q6 and q8 to dense
rows.

Its modules: packed_linear (PackedLinear, the interface, and stacking rows), one per format family as the C++
kernels have them (affine: q4 and q5; q8: q8 and its grouped rows; superblock: q6, q4k, q5k and q5s, Q5_0's blocks as stored; lut4: mxfp4, iq4nl
and iq4xs, 4-bit codes into a table, and q8s, Q8_0's blocks as stored), fusion (fused
q|k|v and gate|up at load: cat_packed, PartsLinear), routing (a step's rows to their weights: RowSplit,
linear) and dense_weights (prompt rows through the exact dense weights: dense_product).

In a model with dense prompt rows (engine.model.packing.repack.keeps_dense_copy: small models, like the default
one) prompt rows take the exact fp32 weights (RowSplit): decoded just in time into a reused scratch buffer
(`jit_dense`, dense_product), or a kept fp32 copy (`dense`) where the packed format isn't exact, every one of them, whatever the chunk size: a prompt
token's K/V and logits are then the dense model's, so they never depend on how the prompt was chunked
(engine.generator.step_budget sizes chunks by measured time) or on how much of it came from the prefix
cache (a cache hit recomputes only the last prompt token: packed, it flipped a greedy reply of the default
model after 25 tokens, measured). That is for the answers' sake: the int8 kernels run prompt chunks of 8-1024
rows 1.3-3.3x faster than fp32 sgemm does, even on a kept copy (kernels/PERF.md). A model too big for a copy
sends prompt rows through the packed kernel too (engine.model.model):
decoding dense tiles of every weight for each chunk cost seconds per short follow-up on a 7B. linear() can
still multiply prompt rows by TILE_ROWS-row dense tiles decoded from the blocks (dense_product; the same
values, never the whole matrix). Which path a row takes depends on the row alone, never on the batch.

May import: ggml_blocks and kernels only (the loader's packing builds these classes, not the reverse).
"""
from __future__ import annotations

from .affine import AffineLinear, Q4Linear, Q5Linear
from .dense_weights import TILE_ROWS, dense_product
from .fusion import PartsLinear, cat_packed
from .lut4 import LUT4_CLASSES, IQ4NLLinear, IQ4XSLinear, Lut4Linear, MXFP4Linear, Q8SLinear
from .packed_linear import TILE_WEIGHTS, PackedLinear, tile_rows
from .q8 import Q8Linear
from .routing import RowSplit, linear
from .superblock import Q2KLinear, Q3KLinear, Q4KLinear, Q5SLinear, Q6Linear, SuperBlockLinear

__all__ = ["AffineLinear", "IQ4NLLinear", "IQ4XSLinear", "LUT4_CLASSES", "Lut4Linear", "MXFP4Linear",
           "PackedLinear", "PartsLinear", "Q2KLinear", "Q3KLinear", "Q4KLinear", "Q4Linear", "Q5Linear",
           "Q5SLinear", "Q6Linear", "Q8Linear", "Q8SLinear", "RowSplit", "SuperBlockLinear", "TILE_ROWS",
           "TILE_WEIGHTS", "cat_packed", "dense_product", "linear", "tile_rows"]

"""Stored matrices into the CPU kernels' formats (engine.model.qlinear's q2k, q3k, q4, q4k, q5, q6 and q8): which
tensors a weight format keeps packed, what each costs, and whether a dense copy for prompt rows is kept.

weights="packed" (auto for a GGUF on a CPU), per ggml type (kernels.formats' table says which format holds
which type exactly; every other type becomes q8):
  * Q4_0, Q4_1 -> q4, exact (Q4_0's w = d(q - 8) is minimum -8d).
  * Q4_K -> q4k: the file's super-blocks as they are (exact, 4.5 bits a weight, its d * sc and dmin * m
    multiplied in fp32). As q4 (one fp16 scale and minimum per 32, 5 bits a weight) a decode step of an
    8B-shaped Q4_K_M file read ~7 % more bytes and the resident weights were larger than the file. q4 of
    Q4_K (q4_parts, kernels/cpu/repack.cpp's q4_k_repack: the products rounded to fp16) is still built where
    Q4_K is fused beside Q4_0/Q4_1 parts, and on a mixed group's way to q8.
  * Q5_0, Q5_1 -> q5, exact (5 bits a weight and q4's scales: Q5_0's w = d(q - 16) is minimum -16d). As q8
    a Gemma-3-270M-like file's Q5_0 q/k/gate/up read 1.55x the bytes a token.
  * Q8_0 -> q8, exact.
  (A model starting on its mapped file reads Q8_0 and Q5_0 as the file stores them until they have moved into
  q8 and q5: start_class, the start-only formats q8s and q5s, with the same bits; engine.model.settle.)
  * Q6_K -> q6: the file's super-blocks as they are (exact, 6.56 bits a weight; as q8 they took 8.5, and a
    Q4_K_M file's output head and half its ffn_down are Q6_K).
  * MXFP4 -> mxfp4, IQ4_NL -> iq4nl, IQ4_XS -> iq4xs: the file's blocks as they are (exact; 4.25, 4.5 and
    4.25 bits a weight, gpt-oss's experts and llama.cpp's IQ4 mixes), 4-bit codes looked up in the format's
    16-entry table by the kernels (kernels/cpu/lut4.h). As q8 they read 2x the bytes a token.
  * Q5_K -> q5k: the file's super-blocks as they are (exact, 5.5 bits a weight; as q8 they took 8.5: every
    Q5_K_M file's matrices and a Q4_K_M file's attn_v and half its ffn_down), multiplied by q4k's kernels
    with the fifth-bit plane added (kernels/cpu/q4k.h).
  * Q3_K -> q3k: the file's super-blocks as they are (exact, 3.44 bits a weight; as q8 they took 8.5, so a
    Q3_K_M file, Q3_K but for its attn_v, ffn_down and head, held ~2x its size), multiplied by q6's kernels
    through Q3_K's layout (kernels/cpu/q6.h).
  * Q2_K -> q2k: the file's super-blocks as they are (exact, 2.63 bits a weight; as q8 they took 8.5, ~3x), q6's
    kernels through Q2_K's layout with q4k's minimums.
  * Every other type (the IQ2/IQ3/IQ1 and T types): the exact decode re-quantized as Q8_0, per 32
    weights symmetric int8: its step is max|w|/127, several times finer than these types' own steps (5 or 6
    bits), so the error it adds is a fraction of the file's own quantization error (measured in the tests).
  * F16/F32/BF16 matrices stay dense; but where the layers are packed, a dense output head is packed as q8
    too (a decode step's largest matrix), with the dense copy for prompt rows only where the rule below
    keeps one.
  Embedding tables (engine.model.embedding): an untied token embedding is kept as the file's own blocks
  (GGMLRows, no kernel format: a lookup decodes a few rows); a tied one is the packed output head, whose
  rows serve the lookups too, so the table is held once.
  Fused matrices (q|k|v, gate|up) whose parts would differ (a Q4_K_M file's Q4_K q/k beside a Q6_K v) keep
  each part's format (qlinear.PartsLinear); where prompt rows take dense weights (below) they are all q8
  instead, Q4_K parts beside Q4_0/Q4_1 ones all q4 (qlinear.cat_packed).
weights="q8": every matrix, dense ones included (HF folders), as Q8_0 of its exact weights.

Dense prompt rows: a model whose packed matrices take at most DENSE_COPY_MAX_BYTES as fp32 (~190M weights)
gives prompt rows the file's exact fp32 weights, for their answers: the default 135M model answers "What is
the capital of France?" with Paris only so (with int8 prompt activations it says "L'Étoile, la Cité...", as
llama.cpp, int8 throughout, does too). It is not for speed: fp32 sgemm is compute bound and the int8 GEMM ran
prompt chunks of 8-1024 rows 1.3-3.3x faster than the default model's kept fp32 copy (kernels/PERF.md). A
bigger model sends prompt rows through the packed kernels too, so resident memory stays near the file size
(a 7B Q4_K_M: ~1.2x) and a mixed step is one pass over the weights. The rule depends on the model alone,
never on free memory, so the same model always loads (and answers) the same way, and the estimate knows it.
Where a matrix's kernel format holds the file's weights exactly (decodes_exactly: Q4_0/Q4_1 as q4, Q5_0/Q5_1 as q5, Q8_0 as
q8, Q2_K, Q3_K, Q6_K, Q4_K, Q5_K, MXFP4, IQ4_NL, IQ4_XS)
no fp32 copy is kept: qlinear.dense_product decodes it just in time into a reused scratch buffer, the same
bits (the default model: ~1x its file instead of ~5.5x with the copy). The others (re-quantized q8, Q4_K
fused as q4) and, under PAGEDECK_DENSE_COPY=1, every matrix keep the copy; PAGEDECK_DENSE_COPY=0 turns
dense prompt rows off for every model (the estimate follows both).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kernels import cpu_ext, formats
from kernels.formats import GROUP, GROUP_ROWS
from kernels.packed import (SCALE_PAD, groupable, pack_nibbles, padded_scales, q5_layout, q8_pack,
                            q8_quantize)

from ... import envs
from . import move_queue, repack_fast
from .readahead import read_ahead
from ..ggml_blocks import dequantize, half, q4_k_affine
from ..qlinear import (LUT4_CLASSES, PackedLinear, Q2KLinear, Q3KLinear, Q4KLinear, Q4Linear, Q5Linear, Q6Linear,
                       Q8Linear, SuperBlockLinear, tile_rows)
from ..qlinear.superblock import Q5KLinear, Q5SLinear

PACKED_FORMATS = ("packed", "q8")
DENSE_COPY_MAX_BYTES = 768 << 20  # the default 135M model (540 MB) under it, a 270M Gemma-3-like file (1.07 GB) over
Q = GGMLQuantizationType
_DENSE = ("F32", "F16", "BF16", "F64")
_EMBED_HEAD = ("lm_head.weight", "embed_tokens.weight", "output.weight", "token_embd.weight")
_CENTRED = {"q4": "Q4_0", "q5": "Q5_0"}  # the stored type of each affine format whose minimums are -centre * d
# matrices packed: the decoder layers' projections (HF and llama.cpp names), the output head, the token embedding
_LAYER_MATRICES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "qkv_proj.weight", "o_proj.weight",
                   "gate_proj.weight", "up_proj.weight", "gate_up_proj.weight", "down_proj.weight",
                   "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.weight", "attn_output.weight",
                   "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
_MATRICES = _LAYER_MATRICES + _EMBED_HEAD
# K-quants kept as the file's super-blocks
_SUPERBLOCKS = {"q6": Q6Linear, "q4k": Q4KLinear, "q5k": Q5KLinear, "q3k": Q3KLinear, "q2k": Q2KLinear}
_STARTS = {"q5s": Q5SLinear}  # start-only formats outside the lookup-table family (kernels.formats.STARTS_ON)
# a GGUF's 3-D expert stacks (experts, rows, cols): packed one expert at a time (engine.model.packing.experts)
EXPERT_STACKS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
# parts fused into one matrix by the model (HF and llama.cpp names), so they share one kernel format
_FUSED = (("q_proj.weight", "k_proj.weight", "v_proj.weight"), ("gate_proj.weight", "up_proj.weight"),
          ("attn_q.weight", "attn_k.weight", "attn_v.weight"), ("ffn_gate.weight", "ffn_up.weight"),
          ("ffn_gate_exps.weight", "ffn_up_exps.weight"))


def keeps_packed(name: str, dtype: str, ndim: int, fmt: str) -> bool:
    """Whether the loader packs this stored tensor under weight format `fmt` (the memory estimate's rule too)."""
    if fmt not in PACKED_FORMATS or ndim != (3 if name.endswith(EXPERT_STACKS) else 2):
        return False
    if not name.endswith(_MATRICES + EXPERT_STACKS):
        return False
    return fmt == "q8" or dtype not in _DENSE


def matrix_parts(name: str, packed: set[str] | dict, kernels: dict[str, str] | None = None) -> list[str]:
    """The packed stored names that become one matrix with `name` (its q|k|v or gate|up, first part first, where
    that first part is packed; with `kernels`, a mixed group's parts stay apart), or [name] for a matrix of its
    own."""
    for group in _FUSED:
        for part in group:
            stem = name[: -len(part)]
            if name.endswith(part) and stem + group[0] in packed:
                names = [stem + p for p in group if stem + p in packed]
                if kernels is None or len({kernels[n] for n in names}) == 1:
                    return names
    return [name]


def fused_into(name: str, packed: set[str] | dict, kernels: dict[str, str] | None = None) -> bool:
    """Whether `name` is a later part of a fused group (k and v of q|k|v, up of gate|up) whose first part is
    in `packed` too: its packed scales then join the first part's buffer (one SCALE_PAD for the group). With
    `kernels` ({name: kernel format}, mixed groups kept in parts) a group of mixed formats joins nothing."""
    return matrix_parts(name, packed, kernels)[0] != name


def minimums_left_out(name: str, packed: dict[str, str], rows: dict[str, int], kernels: dict[str, str],
                      own_formats: bool) -> bool:
    """Whether a decoder layer's packed matrix (or part) holds no minimums once loaded (qlinear.AffineLinear.group
    leaves out minimums that are all -centre * scale): q4 or q5 kept from GGUF Q4_0 or Q5_0, every part of its
    matrix of that type, and the matrix's rows grouped here (kernels.packed.groupable). The memory estimate's
    rule; `packed` {name: stored type}, `rows` {name: output rows}."""
    kernel = kernels.get(name)
    if kernel not in _CENTRED or not name.endswith(_LAYER_MATRICES):
        return False
    parts = matrix_parts(name, packed, kernels if own_formats else None)
    return (all(packed[p] == _CENTRED[kernel] for p in parts)
            and groupable(sum(rows[p] for p in parts), formats.get(kernel).grouped_id))


def gguf_table(name: str, tied: bool, packs: bool) -> str | None:
    """How a GGUF's embedding and head are held where any matrix is packed (`packs`): "rows" for an untied
    token embedding (engine.model.embedding.GGMLRows, the file's blocks), "head" for the output head and a
    tied embedding (packed, dense types as q8); None for every other tensor, or when nothing is packed."""
    if not packs:
        return None
    if name.endswith(("embed_tokens.weight", "token_embd.weight")):
        return "head" if tied else "rows"
    return "head" if name.endswith("lm_head.weight") or name == "output.weight" else None  # not attn_output


def kernel_format(dtype: str, fmt: str) -> str:
    """The kernel format a stored type becomes (before the fused-parts rule): under weights="packed" the one
    holding it exactly (kernels.formats), else q8."""
    return formats.holding(dtype, fmt).name


def block_class(kind: str) -> type[SuperBlockLinear] | None:
    """The class that keeps kernel format `kind` as the file's own blocks (K-quant super-blocks, the 4-bit
    lookup-table formats, the start-only q8s and q5s), or None where the format is repacked (q4, q5, q8)."""
    return _SUPERBLOCKS.get(kind) or LUT4_CLASSES.get(kind) or _STARTS.get(kind)


def start_class(dtype: str, fmt: str) -> type[SuperBlockLinear] | None:
    """The class a model starting on its mapped file reads a stored type's blocks with, as the file stores
    them: its kernel format's own where that keeps them so, else the start-only format reading them with the
    holder's bits (Q8_0: q8s, Q5_0: q5s; kernels.formats.STARTS_ON); None where no kernel reads them as stored."""
    start = formats.STARTS_ON.get(dtype) if fmt == "packed" else None
    return block_class(start.name if start is not None else kernel_format(dtype, fmt))


def kernel_formats(tensors: dict[str, str], fmt: str, own_formats: bool = False) -> dict[str, str]:
    """{name: kernel format} for the packed ones of {stored name: ggml type}, fused parts made to agree, unless
    `own_formats` (mixed_parts_kept: each part of a mixed group keeps its own, qlinear.PartsLinear)."""
    out = {n: kernel_format(d, fmt) for n, d in tensors.items()}
    if own_formats:
        return out
    for n in list(out):
        for group in _FUSED:
            if n.endswith(group[0]):
                names = [n[: -len(group[0])] + part for part in group]
                kinds = {out.get(m) for m in names if m in out}
                if len(kinds) > 1:  # Q4_K beside Q4_0/Q4_1 parts goes back to q4 (cat_packed), else all q8
                    out.update({m: "q4" if kinds == {"q4", "q4k"} else "q8" for m in names if m in out})
    return out


def mixed_parts_kept(dense_copy: bool) -> bool:
    """Whether a fused group of mixed formats keeps each part's own (qlinear.cat_packed's rule): where the
    kernels run and prompt rows do not take dense weights."""
    return not dense_copy and cpu_ext.available()


def packed_nbytes(kernel: str, shape: tuple[int, ...]) -> int:
    """Bytes of an (N, K) matrix in kernel format `kernel` (codes and fp16 scale values; kernels.formats)."""
    return formats.get(kernel).nbytes(int(shape[0]), int(shape[-1]))


def scale_buffers(kernel: str) -> int:
    """Padded fp16 scale buffers a matrix of this format holds (q4, q5: scale and minimum, q8: scale, q6: none)."""
    return formats.get(kernel).scales


def packed_storage_bytes(kernel: str, shape: tuple[int, ...]) -> int:
    """The storage the loader allocates for it: packed_nbytes plus each scale buffer's SCALE_PAD values."""
    return packed_nbytes(kernel, shape) + scale_buffers(kernel) * 2 * SCALE_PAD


def dense_copy_mode() -> str:
    """PAGEDECK_DENSE_COPY (engine.envs parses it): "off" (0/off/no/false: no model gives prompt rows dense
    weights), "keep" (1/keep/on/yes/true: a small model keeps its fp32 copy, for comparing) or "auto" (unset or
    anything else: the rule in the module docstring, just in time where the format is exact)."""
    return envs.PAGEDECK_DENSE_COPY


def dense_copy_enabled() -> bool:
    return dense_copy_mode() != "off"


def dense_copy_forced() -> bool:
    return dense_copy_mode() == "keep"


def keeps_dense_copy(packed_params: int) -> bool:
    """The dense prompt-row rule (module docstring) for a model with this many packed weights: whether its
    prompt rows take the exact dense weights (kept, or decoded just in time; see keeps_copy)."""
    return dense_copy_enabled() and packed_params * 4 <= DENSE_COPY_MAX_BYTES


def decodes_exactly(dtype: str, kernel: str) -> bool:
    """Whether a stored type held in this kernel format decodes to the file's exact weights (dense_rows):
    Q4_0/Q4_1 as q4, Q5_0/Q5_1 as q5, Q8_0 as q8, Q6_K and Q4_K as their own super-blocks. Re-quantized types
    (q8 of Q5_K, F16...) and Q4_K as q4 (fp16-rounded scales) do not: those keep an fp32 copy for prompt rows."""
    return formats.holds_exactly(dtype, kernel)


def copied(tensors: dict[str, str], kernels: dict[str, str]) -> set[str]:
    """Which packed tensors ({name: ggml type}, their final kernels) keep an fp32 copy where prompt rows are
    dense: every one under PAGEDECK_DENSE_COPY=1, else those that don't decode exactly and the other parts of
    their fused group (qlinear.cat_packed stacks one copy for the whole group)."""
    if dense_copy_forced():
        return set(tensors)
    out = {n for n, d in tensors.items() if not decodes_exactly(d, kernels[n])}
    for n in list(tensors):
        for group in _FUSED:
            if n.endswith(group[0]):
                names = [n[: -len(group[0])] + part for part in group]
                if any(m in out for m in names):
                    out.update(m for m in names if m in tensors)
    return out


def from_blocks(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int], fmt: str = "packed",
                keep_dense: bool = True, done: Callable[[int, int], None] | None = None) -> PackedLinear:
    """A GGUF matrix (N rows of ggml bytes) in its kernel format, written tile by tile into the final packed
    tensors: loading holds the packed result and one tile's temporaries, never (N, K) codes or fp32.
    done(r0, r1) is told when rows [r0, r1) have been read for the last time (the loader lets their pages
    of the mapped file go, so the file and its packed form are not both resident)."""
    n, k = shape
    if k % GROUP:
        raise ValueError(f"packed matrices need K % {GROUP} == 0, got {tuple(shape)}")
    rows, step = raw.reshape(n, -1), tile_rows(k)  # dense types (F16, F32, BF16) become q8 tile by tile too
    read_ahead(rows)  # the file's pages read at once, not a small window a fault (packing.readahead)
    # prompt rows: the file's exact weights, decoded just in time where the kernel format holds them exactly
    jit = keep_dense and not dense_copy_forced() and decodes_exactly(qtype.name, kernel_format(qtype.name, fmt))
    keep_dense = keep_dense and not jit
    exact = dequantize(rows, qtype, (n, k)) if keep_dense else None
    out = _from_blocks(rows, qtype, (n, k), fmt, keep_dense, exact, step, done)
    out.jit_dense = jit
    return out


def _from_blocks(rows: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int], fmt: str, keep_dense: bool,
                 exact: torch.Tensor | None, step: int, done: Callable[[int, int], None] | None) -> PackedLinear:
    n, k = shape
    kind = kernel_format(qtype.name, fmt)
    cls = block_class(kind)
    if cls is not None and cls.GROUPS and groupable(n, cls.spec.grouped_id):  # the file's super-blocks, into groups
        groups, step = cls.empty_groups(n, k), max(GROUP_ROWS, step // GROUP_ROWS * GROUP_ROWS)
        for r0 in range(0, n, step):
            move_queue.group(rows[r0:r0 + step], groups[r0 // GROUP_ROWS:(r0 + step) // GROUP_ROWS], cls.BLOCK_BYTES)
            if done is not None:
                done(r0, min(r0 + step, n))
        return cls(groups, exact, grouped=True)
    if kind in _SUPERBLOCKS or kind in LUT4_CLASSES:  # the file's blocks, copied
        qs = torch.empty(rows.shape, dtype=torch.uint8)
        for r0 in range(0, n, step):
            move_queue.copy(rows[r0:r0 + step], qs[r0:r0 + step])
            if done is not None:
                done(r0, min(r0 + step, n))
        return LUT4_CLASSES.get(kind, _SUPERBLOCKS.get(kind))(qs, exact)
    if kernel_format(qtype.name, fmt) == "q5":
        return _q5_from_blocks(rows, qtype, (n, k), exact, step, done)
    fast = repack_fast.pack(rows, qtype, (n, k), kernel_format(qtype.name, fmt))  # C++, same bits
    if fast is not None:
        fast.dense = exact
        return fast
    scale = padded_scales(n, k // GROUP)
    if kernel_format(qtype.name, fmt) == "q8":
        qs = torch.empty(n, k, dtype=torch.uint8)
        for r0 in range(0, n, step):
            tile = rows[r0:r0 + step]
            if not repack_fast.tile_into(tile, qtype, "q8", qs[r0:r0 + step], scale[r0:r0 + step]):  # Q8_0 in C++
                if qtype == Q.Q8_0:  # exact: the file's codes and scales
                    blocks = tile.reshape(-1, GGML_QUANT_SIZES[qtype][1])
                    codes, scale[r0:r0 + step] = blocks[:, 2:].reshape(tile.shape[0], k), half(blocks, 0).view(-1, k // GROUP)
                else:
                    codes, scale[r0:r0 + step] = q8_quantize(dequantize(tile, qtype, (tile.shape[0], k)))
                qs[r0:r0 + step] = q8_pack(codes)  # code + 128 (the kernel's u8 x s8 form)
            if done is not None:
                done(r0, min(r0 + step, n))
        return Q8Linear.from_packed(qs, scale, exact, keep_dense)
    qs, minimum = torch.empty(n, k // 2, dtype=torch.uint8), padded_scales(n, k // GROUP)
    for r0 in range(0, n, step):
        tile = rows[r0:r0 + step]
        if not repack_fast.tile_into(tile, qtype, "q4", qs[r0:r0 + step], scale[r0:r0 + step], minimum[r0:r0 + step]):
            codes, scale[r0:r0 + step], minimum[r0:r0 + step] = q4_parts(tile, qtype, k)  # Q4_K, or no C++
            qs[r0:r0 + step] = pack_nibbles(codes)
        if done is not None:
            done(r0, min(r0 + step, n))
    out = Q4Linear.from_packed(qs, scale, minimum)
    out.dense = exact  # exact, also for Q4_K (whose packed scales are fp16-rounded)
    return out


def _q5_from_blocks(rows: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int],
                    exact: torch.Tensor | None, step: int, done: Callable[[int, int], None] | None) -> Q5Linear:
    """Q5_0 / Q5_1 rows as q5: the file's nibbles and fifth bits moved into q5_layout's order, its d (and Q5_1's
    m; Q5_0's is -16d, exact in fp16) as the scales, a tile of rows at a time."""
    n, k = shape
    g = k // GROUP
    qs = torch.empty(n, formats.Q5.row_bytes(k), dtype=torch.uint8)
    scale, minimum = padded_scales(n, g), padded_scales(n, g)
    head = 4 if qtype == Q.Q5_1 else 2  # bytes of d (and m) before the block's qh (4) and nibbles (16)
    for r0 in range(0, n, step):
        tile = rows[r0:r0 + step]
        if repack_fast.tile_into(tile, qtype, "q5", qs[r0:r0 + step], scale[r0:r0 + step], minimum[r0:r0 + step]):
            if done is not None:
                done(r0, min(r0 + step, n))
            continue
        blocks = tile.reshape(-1, GGML_QUANT_SIZES[qtype][1])
        d = half(blocks, 0)
        scale[r0:r0 + step] = d.view(-1, g)
        minimum[r0:r0 + step] = (half(blocks, 2) if qtype == Q.Q5_1 else -16 * d).view(-1, g)
        nibbles, fifth = blocks[:, head + 4:].reshape(-1, g, 16), blocks[:, head:head + 4].reshape(-1, g, 4)
        qs[r0:r0 + step] = q5_layout(nibbles, fifth)
        if done is not None:
            done(r0, min(r0 + step, n))
    out = Q5Linear.from_packed(qs, scale, minimum)
    out.dense = exact
    return out


def q4_parts(rows: torch.Tensor, qtype: GGMLQuantizationType, k: int):
    """(codes (n, k) uint8, scale, minimum (n, k/32) fp32) of Q4_0/Q4_1/Q4_K rows: w = code*scale + minimum."""
    n, g = rows.shape[0], k // GROUP
    blocks = rows.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    if qtype == Q.Q4_K:
        q, s, m = q4_k_affine(blocks)  # w = s*q - m per sub-block of 32
        return q.reshape(n, k), s.reshape(n, g), -m.reshape(n, g)
    d = half(blocks, 0)
    minimum = half(blocks, 2) if qtype == Q.Q4_1 else -8 * d
    qs = blocks[:, 4:] if qtype == Q.Q4_1 else blocks[:, 2:]
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=1)  # low nibbles are weights 0..15 of a block, high 16..31
    return codes.reshape(n, k), d.reshape(n, g), minimum.reshape(n, g)

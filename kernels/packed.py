"""Packed (quantized) weight layouts and their matmul: what kernels/cpu/qmatmul.cpp and decode.cpp read.
kernels.formats is the formats' table (names, GGUF types held, block sizes, C++ ids); this module packs and
unpacks their bytes.

A packed (N, K) weight is `blocks` = (qs, d, m), in blocks of 32 weights along K:
- d: fp16 (N, K/32) scales, in a buffer SCALE_PAD values longer (the kernels load 8 scales at a time);
- q4: qs uint8 (N, K/2) in GGUF nibble order (the low nibbles are weights 0..15 of a block), m fp16 (N, K/32)
  minimums like d: w = d * code + m, code 0..15 (GGUF Q4_1; Q4_0 is m = -8d);
- q5: qs uint8 (N, K/32 * 20): 5-bit codes as 16 nibble bytes and 4 bytes of fifth bits a block (pairs of
  blocks interleaved for the kernel: q5_pack), d and m as q4's: w = d * code + m, code 0..31 (GGUF Q5_1; Q5_0
  is m = -16d) (kernels/cpu/affine.h);
- q8: qs uint8 (N, K) = code + 128 (the kernel multiplies u8 by s8), m None: w = d * code, code int8 (GGUF
  Q8_0's rule, symmetric, d = max|w| / 127 per block).
- q6: qs uint8 (N, K/256 * 210): GGUF Q6_K super-blocks as the file stores them (6.56 bits a weight:
  w = d * sc * (code - 32), int8 sc per 16 weights, fp16 d per 256, all inside the block), d an empty fp16
  tensor, m None (kernels/cpu/q6.h).
- q3k: qs uint8 (N, K/256 * 110): GGUF Q3_K super-blocks as the file stores them (3.44 bits a weight:
  w = d * sc * (code - 4), codes 0..7 from a third-bit plane and 2-bit pairs, 6-bit sc - 32 per 16 weights, fp16
  d per 256, all inside the block), d an empty fp16 tensor, m None (kernels/cpu/q6.h's Q3K layout).
- q2k: qs uint8 (N, K/256 * 84): GGUF Q2_K super-blocks as the file stores them (2.63 bits a weight:
  w = d * sc * code - dmin * m, codes 0..3, 4-bit sc and m per 16 weights, fp16 d and dmin per 256), d an empty
  fp16 tensor, m None (kernels/cpu/q6.h's Q2K layout).
- q4k: qs uint8 (N, K/256 * 144): GGUF Q4_K super-blocks as the file stores them (4.5 bits a weight:
  w = d * sc * code - dmin * m, 6-bit sc and m per 32 weights, fp16 d and dmin per 256), d an empty fp16
  tensor, m None (kernels/cpu/q4k.h).
- q4k16: the same Q4_K super-blocks with rows regrouped GROUP_ROWS at a time, qs uint8 (N/16, K/256 * 2304)
  (kernels/cpu/q4k16.h): one vector holds 16 rows' bytes, so a decode-sized product needs no horizontal
  reduction; the same bits as the rows. Built by group_superblocks where the CPU kernels run and N % 32 == 0;
  superblock_rows gives the rows back.
- q6k16: Q6_K super-blocks regrouped the same way, qs uint8 (N/16, K/256 * 3360) (kernels/cpu/q6k16.h): the
  codes of 16 rows are taken apart once for all the activation rows of a call; the same bits as the rows.
  Built only where its kernel is vectorized (AVX-512 VNNI builds: native_group).
- q5k16: Q5_K super-blocks regrouped the same way, qs uint8 (N/16, K/256 * 2816) (kernels/cpu/q5k16.h), q6k16's
  scheme with q5k's bits; AVX-512 VNNI builds only, as q6k16.
- q3k16: Q3_K super-blocks regrouped the same way, qs uint8 (N/16, K/256 * 1760) (kernels/cpu/q3k16.h), q6k16's
  scheme with q3k's bits (its codes unpacked into q6k16's vectors); AVX-512 VNNI builds only.
- iq4xs16: IQ4_XS super-blocks regrouped the same way, qs uint8 (N/16, K/256 * 2176) (kernels/cpu/iq4xs16.h),
  q6k16's scheme with iq4xs's (lut4's) bits; AVX-512 VNNI builds only.
- q8g: q8 with rows regrouped GROUP_ROWS at a time in the GEMM tiles' own layout (kernels/cpu/q8.h): qs uint8
  (N/16, K/32 * 512), [block][4-byte step][row], d fp16 (N/16, K/32 * 16), [block][row], m None. Every row
  count multiplies with no panel to unpack; the same bits as the rows. q8_group / q8_ungroup convert.
- q4g, q5g: q4 and q5 with rows regrouped GROUP_ROWS at a time (kernels/cpu/affine_groups.h): qs uint8
  (N/16, K/32 * 256), [block][4-byte word][row] (q5g: K/32 * 320, each block then [row][32 fifth bits]), d and m
  fp16 (N/16, K/32 * 16), [block][row]: one vector holds 16 rows' words, so a decode-sized product needs no
  horizontal reduction; the same bits as the rows. m is None where every minimum is -8 d (q4g: GGUF Q4_0) or
  -16 d (q5g: GGUF Q5_0): a token then reads the file's bytes. AVX-512 VNNI builds only; q4_group / q4_ungroup
  and q5_group / q5_ungroup convert.

qmatmul() quantizes each activation row to int8 per block and multiplies with integer dot products, as
llama.cpp does (pagedeck's CPU kernels, kernels.cpu_ext); every output element is computed the same way
whatever the row count, so a row's result never depends on the batch. Where those kernels are not built,
int4_matmul is torch's own int4 CPU kernel (bf16 activations), the q4 fallback.
"""
from __future__ import annotations

import torch

from engine import envs

from . import cpu_ext
from .formats import GROUP, GROUP_ROWS, Q5

SCALE_PAD = 8  # the kernels load 8 fp16 scales at a time, so scale tensors carry 8 more values of storage
ACTIVATIONS = {None: 0, "swiglu": 1}  # fused epilogues of the kernel: silu(gate) * up for [gate | up] rows
QUANTIZE_ROWS = 1024  # rows per fp32 temporary while quantizing to q8
_Q5_BYTES = Q5.code_bytes  # q5's bytes a block (16 of nibbles, 4 of fifth bits)
NO_SCALES = torch.empty(0, dtype=torch.float16)  # q6's d argument: its scales live inside the super-blocks


def padded_scales(n: int, groups: int) -> torch.Tensor:
    """fp16 (n, groups) scales in a buffer SCALE_PAD values longer, to be filled in place (tile by tile) by the
    caller, which writes every value: only the padding is zeroed here (zeroing the whole buffer first wrote
    every scale twice, a large share of a small model's load)."""
    buf = torch.empty(n * groups + SCALE_PAD, dtype=torch.float16)
    buf[n * groups:].zero_()
    return buf[: n * groups].view(n, groups)


def pad_scales(t: torch.Tensor) -> torch.Tensor:
    """fp16 copy of (N, K/32) scales in a buffer SCALE_PAD values longer (zeros)."""
    buf = padded_scales(*t.shape)
    buf.copy_(t)
    return buf


def groupable(n: int, grouped_id: int | None = None) -> bool:
    """Whether n rows are kept in groups of 16 here: the CPU kernels built, whole groups in each half (a
    [gate | up] matrix's SwiGLU splits it in halves), not turned off (PAGEDECK_ROW_GROUPS=0 keeps the rows, for
    benchmarks comparing the two), and, given a grouped format's id, its group kernel vectorized in this build
    (native_group)."""
    return (n % (2 * GROUP_ROWS) == 0 and envs.PAGEDECK_ROW_GROUPS and cpu_ext.ops() is not None
            and (grouped_id is None or native_group(grouped_id)))


def native_group(grouped_id: int) -> bool:
    """Whether this build's kernel for the grouped format `grouped_id` is vectorized (q4k16: AVX2; q5k16, q6k16
    and iq4xs16: AVX-512 VNNI); elsewhere a group's rows go one by one through the rows' kernel, slower than
    rows."""
    ops = cpu_ext.ops()
    return ops is not None and grouped_id in ops.native_groups()


def group_superblocks(rows: torch.Tensor, groups: torch.Tensor, block_bytes: int) -> None:
    """Super-block rows (n, K/256 * block_bytes) -> groups (n/16, K/256 * 16 * block_bytes), into `groups`."""
    cpu_ext.ops().group_superblocks(rows.contiguous(), groups, block_bytes)


def superblock_rows(groups: torch.Tensor, block_bytes: int) -> torch.Tensor:
    """Groups (g, K/256 * 16 * block_bytes) -> their super-block rows (16 g, K/256 * block_bytes)."""
    rows = torch.empty(groups.shape[0] * GROUP_ROWS, groups.shape[1] // GROUP_ROWS, dtype=torch.uint8)
    cpu_ext.ops().ungroup_superblocks(groups.contiguous(), rows, block_bytes)
    return rows


def check_blocks(N: int, K: int, scale: torch.Tensor) -> None:
    if K % GROUP or scale.shape != (N, K // GROUP):
        raise ValueError(f"packed weights want (N, K) with K % {GROUP} == 0 and (N, K/{GROUP}) scales, "
                         f"got ({N}, {K}) and {tuple(scale.shape)}")


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes 0..15 -> (N, K/2) bytes in GGUF nibble order (low nibbles weights 0..15 of a block)."""
    N, K = codes.shape
    c = codes.to(torch.uint8).reshape(N, K // GROUP, 2, 16)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(N, K // 2)


def unpack_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(N, K/2) q4 bytes -> (N, K) codes 0..15 (uint8)."""
    n, k = qs.shape[0], qs.shape[1] * 2
    b = qs.view(n, k // GROUP, 1, 16)
    return torch.cat([b & 0xF, b >> 4], dim=2).reshape(n, k)


def q4_dequantize(qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """The fp32 (N, K) weights of q4 rows."""
    n, k = qs.shape[0], qs.shape[1] * 2
    codes = unpack_nibbles(qs).view(n, k // GROUP, GROUP).float()
    return (codes * scale.float()[..., None] + minimum.float()[..., None]).view(n, k)


def q5_layout(nibbles: torch.Tensor, fifth: torch.Tensor) -> torch.Tensor:
    """q5's qs (N, nb * 20) from each block's 16 nibble bytes (N, nb, 16; GGUF order) and 4 bytes of fifth bits
    (N, nb, 4; bit i of the little-endian word for weight i, GGUF Q5_0/Q5_1's qh): blocks in pairs, both
    blocks' nibbles and then the pair's bits as 16-bit words [j low, j+1 low, j high, j+1 high] (the low half
    goes with the low nibbles, weights 0..15); an odd last block as it is (kernels/cpu/affine.h)."""
    n, nb = nibbles.shape[:2]
    even = nb // 2 * 2
    out = torch.empty(n, nb * _Q5_BYTES, dtype=torch.uint8)
    pairs = out[:, : even * _Q5_BYTES].view(n, nb // 2, 2 * _Q5_BYTES)
    pairs[..., :32] = nibbles[:, :even].reshape(n, nb // 2, 32)
    pairs[..., 32:] = fifth[:, :even].reshape(n, nb // 2, 2, 2, 2).transpose(2, 3).reshape(n, nb // 2, 8)
    if nb % 2:
        out[:, even * _Q5_BYTES: even * _Q5_BYTES + 16] = nibbles[:, -1]
        out[:, even * _Q5_BYTES + 16:] = fifth[:, -1]
    return out


def q5_fields(qs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q5_layout's inverse: (nibbles (N, nb, 16), fifth bits (N, nb, 4))."""
    n, nb = qs.shape[0], qs.shape[1] // _Q5_BYTES
    even = nb // 2 * 2
    pairs = qs[:, : even * _Q5_BYTES].reshape(n, nb // 2, 2 * _Q5_BYTES)
    nibbles = pairs[..., :32].reshape(n, even, 16)
    fifth = pairs[..., 32:].reshape(n, nb // 2, 2, 2, 2).transpose(2, 3).reshape(n, even, 4)
    if nb % 2:
        last = qs[:, even * _Q5_BYTES:]
        nibbles, fifth = torch.cat([nibbles, last[:, None, :16]], 1), torch.cat([fifth, last[:, None, 16:]], 1)
    return nibbles, fifth


_BITS = torch.arange(8, dtype=torch.uint8)


def q5_pack(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes 0..31 -> q5's qs (N, K/32 * 20)."""
    n, k = codes.shape
    c = codes.to(torch.uint8)
    fifth = (((c >> 4) & 1).view(n, k // GROUP, 4, 8) << _BITS).sum(-1, dtype=torch.uint8)
    return q5_layout(pack_nibbles(c & 15).view(n, k // GROUP, 16), fifth)


def q5_codes(qs: torch.Tensor) -> torch.Tensor:
    """q5's qs (N, K/32 * 20) -> (N, K) codes 0..31 (uint8)."""
    nibbles, fifth = q5_fields(qs)
    n, nb = nibbles.shape[:2]
    low = torch.cat([nibbles & 15, nibbles >> 4], dim=2)
    high = ((fifth[..., None] >> _BITS) & 1).reshape(n, nb, GROUP)
    return (low | high << 4).reshape(n, nb * GROUP)


def q5_dequantize(qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """The fp32 (N, K) weights of q5 rows."""
    codes = q5_codes(qs)
    n, k = codes.shape
    w = codes.view(n, k // GROUP, GROUP).float() * scale.float()[..., None] + minimum.float()[..., None]
    return w.view(n, k)


def q8_pack(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes -> the kernel's uint8 code + 128."""
    return codes.contiguous().view(torch.uint8) ^ 0x80


def q8_unpack(qs: torch.Tensor) -> torch.Tensor:
    """The kernel's uint8 code + 128 -> int8 codes."""
    return (qs ^ 0x80).view(torch.int8)


def q8_group(qs: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q8 rows (qs (N, K), scale (N, K/32), N % 16 == 0) -> q8g groups (qs (N/16, K/32 * 512), d (N/16, K/32 *
    16)), in place: a group's rows and its groups hold the same bytes, so the returned tensors view the rows'
    storage, now in group order (needs the CPU kernels, as q8g's product does)."""
    n, k = qs.shape
    cpu_ext.ops().q8_group_in_place(qs, scale)
    return qs.view(n // GROUP_ROWS, k * GROUP_ROWS), scale.view(n // GROUP_ROWS, k // GROUP * GROUP_ROWS)


def q8_ungroup(qs: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q8g groups -> q8 rows (qs (N, K), scale (N, K/32), not padded): q8_group's inverse."""
    g, nb = d.shape[0], d.shape[1] // GROUP_ROWS
    codes = qs.view(g, nb, 8, GROUP_ROWS, 4).permute(0, 3, 1, 2, 4)
    scale = d.view(g, nb, GROUP_ROWS).transpose(1, 2)
    return codes.reshape(g * GROUP_ROWS, nb * GROUP), scale.reshape(g * GROUP_ROWS, nb)


def q4_group(qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q4 rows (qs (N, K/2), scale and minimum (N, K/32), N % 16 == 0) -> q4g groups (qs (N/16, K/32 * 256), d and
    m (N/16, K/32 * 16)), in place as q8_group (kernels/cpu/affine_groups.h states the layout; needs the CPU
    kernels)."""
    n, half = qs.shape
    cpu_ext.ops().q4_group_in_place(qs, scale, minimum)
    nb = half // 16
    return (qs.view(n // GROUP_ROWS, half * GROUP_ROWS), scale.view(n // GROUP_ROWS, nb * GROUP_ROWS),
            minimum.view(n // GROUP_ROWS, nb * GROUP_ROWS))


def q4_ungroup(qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q4g groups -> q4 rows (qs (N, K/2), scale and minimum (N, K/32), not padded): q4_group's inverse."""
    g, nb = d.shape[0], d.shape[1] // GROUP_ROWS
    codes = qs.view(g, nb, 4, GROUP_ROWS, 4).permute(0, 3, 1, 2, 4).reshape(g * GROUP_ROWS, nb * 16)
    return (codes, d.view(g, nb, GROUP_ROWS).transpose(1, 2).reshape(g * GROUP_ROWS, nb),
            m.view(g, nb, GROUP_ROWS).transpose(1, 2).reshape(g * GROUP_ROWS, nb))


def q5_group(qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q5 rows (qs (N, K/32 * 20) in q5_layout's order, scale and minimum (N, K/32), N % 16 == 0) -> q5g groups
    (qs (N/16, K/32 * 320), d and m (N/16, K/32 * 16)), new tensors (kernels/cpu/affine_groups.h states the
    layout: per block q4g's nibble words, then each row's 32 fifth bits)."""
    nibbles, fifth = q5_fields(qs)
    n, nb = nibbles.shape[:2]
    g = n // GROUP_ROWS
    words = nibbles.reshape(g, GROUP_ROWS, nb, 4, 4).permute(0, 2, 3, 1, 4).reshape(g, nb, 256)
    bits = fifth.reshape(g, GROUP_ROWS, nb, 4).permute(0, 2, 1, 3).reshape(g, nb, 64)
    by_block = [padded_scales(g, nb * GROUP_ROWS) for _ in (scale, minimum)]  # the rows' bytes, padding included
    for t, rows in zip(by_block, (scale, minimum)):
        t.copy_(rows.reshape(g, GROUP_ROWS, nb).transpose(1, 2).reshape(g, nb * GROUP_ROWS))
    return torch.cat([words, bits], 2).reshape(g, nb * 320), *by_block


def q5_ungroup(qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q5g groups -> q5 rows (qs (N, K/32 * 20), scale and minimum (N, K/32), not padded): q5_group's inverse."""
    g, nb = d.shape[0], d.shape[1] // GROUP_ROWS
    blocks = qs.view(g, nb, 320)
    nibbles = blocks[..., :256].reshape(g, nb, 4, GROUP_ROWS, 4).permute(0, 3, 1, 2, 4).reshape(g * GROUP_ROWS, nb, 16)
    fifth = blocks[..., 256:].reshape(g, nb, GROUP_ROWS, 4).permute(0, 2, 1, 3).reshape(g * GROUP_ROWS, nb, 4)
    return (q5_layout(nibbles, fifth), d.view(g, nb, GROUP_ROWS).transpose(1, 2).reshape(g * GROUP_ROWS, nb),
            m.view(g, nb, GROUP_ROWS).transpose(1, 2).reshape(g * GROUP_ROWS, nb))


def q8_dequantize(qs: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp32 (N, K) weights of q8 rows."""
    n, k = qs.shape
    w = q8_unpack(qs).float().view(n, k // GROUP, GROUP) * scale.float()[..., None]
    return w.view(n, k)


def q8_quantize(w: torch.Tensor, rows: int = QUANTIZE_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes (N, K) int8, scale (N, K/32) fp16) exactly as gguf.quants writes Q8_0, `rows` rows at a
    time (no whole-matrix fp32 temporaries)."""
    N, K = w.shape
    codes = torch.empty(N, K, dtype=torch.int8)
    scale = torch.empty(N, K // GROUP, dtype=torch.float16)
    ops = cpu_ext.ops()
    if ops is not None:  # kernels/cpu/repack.cpp: the same rule in one pass, no whole-tile temporaries
        for r0 in range(0, N, rows):
            ops.q8_quantize_into(w[r0:r0 + rows].detach().float().contiguous(), codes[r0:r0 + rows],
                                 scale[r0:r0 + rows], False)
        return codes, scale
    for r0 in range(0, N, rows):
        blocks = w[r0:r0 + rows].detach().float().reshape(-1, K // GROUP, GROUP)
        d = blocks.abs().amax(-1) / 127
        q = blocks * torch.where(d > 0, 1 / d, torch.zeros(()))[..., None]  # gguf: codes from the fp32 scale,
        q = q.sign() * (q.abs() + 0.5).floor()  # rounded half away from zero, the scale then stored as fp16
        codes[r0:r0 + rows] = q.clamp(-127, 127).to(torch.int8).reshape(-1, K)
        scale[r0:r0 + rows] = d.to(torch.float16)
    return codes, scale


def qmatmul(x: torch.Tensor, blocks: tuple, fmt: int, act: str | None = None) -> torch.Tensor | None:
    """x (M, K) @ W.T for W packed as `blocks` (qs, d, m) in the layout of kernel id `fmt` (kernels.formats;
    the kernel refuses blocks whose shapes are not that layout's) -> (M, N), or (M, N/2) with act="swiglu"
    (silu(gate) * up of a [gate | up] weight); None where the kernels don't run for x (not built, or x not
    fp32 on the CPU): the caller takes its fallback."""
    ops = cpu_ext.ops() if x.device.type == "cpu" and x.dtype == torch.float32 else None
    return None if ops is None else ops.qmatmul(x.contiguous(), *blocks, fmt, ACTIVATIONS[act])


def q4_supported() -> bool:
    """Whether a q4 matmul exists here: pagedeck's kernel, or torch's int4 CPU kernel as the fallback."""
    return cpu_ext.available() or int4_available()


def int4_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def int4_weight(qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q4 blocks in torch's int4 form: w = (code - 8) * scale + zero, bf16 scales and zeros."""
    zero = minimum.float() + 8 * scale.float()
    return (torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpack_nibbles(qs).to(torch.int32), 1),
            torch.stack([scale.float().t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous())


def int4_matmul(x: torch.Tensor, weight: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x (M, K) @ W.T with torch's int4 CPU kernel (bf16 activations), for W from int4_weight()."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), weight[0], GROUP, weight[1]).to(x.dtype)


def stack_entry(blocks: tuple) -> list[torch.Tensor]:
    """One matrix of kernels.decode_layers' weight list: (qs, d, m) of each part (one part but for a matrix
    kept in several formats), an empty tensor standing for q8's and q6's m."""
    out = []
    for i in range(0, len(blocks), 3):
        qs, d, m = blocks[i:i + 3]
        out += [qs, d, m if m is not None else d.new_empty(0)]
    return out

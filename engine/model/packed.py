"""Quantized matrices kept packed for the CPU (weights="packed", "q8"): GGUF blocks repacked into what
torch's CPU kernels multiply, with prompt rows served by dense tiles instead of a whole dense copy.

Formats, all through one interface (PackedLinear):
  * Q4_0, Q4_1, Q4_K: one int4 "plane" for torch's int4 kernel (per-32 group scale and zero, bf16), an
    exact re-expression of the block: w = (code - 8) * scale + zero with scale = d*sc, zero = 8*scale - dmin*m.
  * Q5_K, Q8_0: two int4 planes whose sum is the weight (low four bits, and the rest scaled by 16): exact
    but for the bf16 rounding of scales, at 1.25 bytes a weight.
  * every other type (Q6_K, Q2_K, Q3_K, Q5_0/1, IQ*): its exact decode re-quantized as Q8_0 (int8 per 32
    weights, two planes). Q6_K's own scales cover 16 weights, finer than any torch kernel's groups, so
    this is an approximation, but a fine one: Q8_0's step is ~1/4 of Q6_K's.
Rows are padded to a multiple of 64 (the int4 layout's block). The int4 kernel rounds activations to bf16.
The token embedding and the output head are the exception: their exact decode is re-quantized to int8
per row for torch's int8 kernel, which keeps fp32 activations. bf16 activations into the head flipped the
default model's greedy answer (measured: "L'Étoile, ..." instead of "Paris"); int8 rows with fp32 keep it.

Prefill: a matmul over many rows would be compute bound in these kernels, so prompt rows go through
fp32 tiles of TILE_ROWS output rows, dequantized from the planes on the fly (never the whole matrix).
This unpacking relies on the CPU int4 layout ([N/64][K][32] bytes, rows n and n+32 of a block sharing
a byte); `layout_ok()` checks it against the packing op itself, and the tests run that check.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from . import ggml_blocks
from .ggml_blocks import dequantize, half

GROUP = 32
BLOCK_N = 64  # rows per block of torch's CPU int4 layout
TILE_ROWS = 1024  # output rows per dense prefill tile
PACKED_FORMATS = ("packed", "q8")
Q = GGMLQuantizationType
PLANE_COUNT = {Q.Q4_0: 1, Q.Q4_1: 1, Q.Q4_K: 1, Q.Q5_K: 2, Q.Q8_0: 2}
_DENSE = ("F32", "F16", "BF16", "F64")
_ROWS = ("lm_head.weight", "embed_tokens.weight", "output.weight", "token_embd.weight")  # int8 rows, fp32 activations
# matrices packed: projections, the output head and the token embedding (HF and llama.cpp names)
_MATRICES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "qkv_proj.weight", "o_proj.weight",
             "gate_proj.weight", "up_proj.weight", "gate_up_proj.weight", "down_proj.weight", "lm_head.weight",
             "embed_tokens.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.weight",
             "attn_output.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "output.weight",
             "token_embd.weight")


def supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(torch, "_weight_int8pack_mm")


def int8_rows(name: str) -> bool:
    """The embedding table and the output head are kept as int8 rows (see the module docstring)."""
    return name.endswith(_ROWS)


def keeps_packed(name: str, dtype: str, ndim: int, fmt: str, kind: str) -> bool:
    """Whether the loader packs this stored tensor under weight format `fmt` (the memory estimate's rule too)."""
    if fmt not in PACKED_FORMATS or ndim != 2 or not name.endswith(_MATRICES):
        return False
    return fmt == "q8" or dtype not in _DENSE


def packed_nbytes(dtype: str, shape: tuple[int, ...], fmt: str, name: str = "") -> int:
    """Resident bytes of the packed (rows, K) matrix `name` stored as ggml type `dtype`."""
    n, k = int(shape[0]), int(shape[-1])
    if int8_rows(name):
        return n * k + 4 * n
    n_pad = -(-n // BLOCK_N) * BLOCK_N
    planes = 2 if dtype in _DENSE else PLANE_COUNT.get(Q[dtype], 2)  # dense and other types: as Q8_0
    return planes * (n_pad * k // 2 + (k // GROUP) * n_pad * 2 * 2)


@functools.lru_cache(maxsize=1)
def layout_ok() -> bool:
    """The int4 CPU layout is what unpack_int4 assumes (a torch internal: checked, not trusted)."""
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (2 * BLOCK_N, 3 * GROUP), generator=g, dtype=torch.int32)  # two row blocks
    return torch.equal(unpack_int4(torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1), codes.shape[1]),
                       codes.to(torch.uint8))


def unpack_int4(packed: torch.Tensor, k: int, rows: slice | None = None) -> torch.Tensor:
    """Codes (n, k) uint8 of the int4 layout's row blocks (`rows` a slice on 64-row boundaries)."""
    q = packed.view(-1, k, BLOCK_N // 2)
    if rows is not None:
        q = q[rows.start // BLOCK_N: rows.stop // BLOCK_N]
    return torch.cat([q & 0x0F, q >> 4], dim=2).transpose(1, 2).reshape(-1, k)


class _Plane:
    """One int4 matrix: codes packed for the kernel, bf16 (scale, zero) per 32 weights."""

    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor):
        self.packed = packed
        self.scales_zeros = scales_zeros

    @classmethod
    def from_tiles(cls, tiles: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], pad: int) -> "_Plane":
        """Pack tile by tile (each a multiple of 64 rows but the last, padded here): the layout's row blocks
        are independent, so the packed tiles concatenate, and no whole-matrix int32 copy is ever made."""
        packed, sz = [], []
        for i, (codes, scale, zero) in enumerate(tiles):
            if i == len(tiles) - 1 and pad:
                k = codes.shape[1]
                codes = torch.cat([codes, codes.new_full((pad, k), 8)])
                scale = torch.cat([scale, scale.new_zeros(pad, k // GROUP)])
                zero = torch.cat([zero, zero.new_zeros(pad, k // GROUP)])
            packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1))
            sz.append(torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16))
        return cls(torch.cat(packed), torch.cat(sz, dim=1).contiguous())

    def dense(self, rows: slice, k: int) -> torch.Tensor:
        codes = unpack_int4(self.packed, k, rows).float().view(-1, k // GROUP, GROUP)
        sz = self.scales_zeros[:, rows].float()  # (K/32, rows, 2)
        return ((codes - 8) * sz[..., 0].t()[..., None] + sz[..., 1].t()[..., None]).view(-1, k)

    def nbytes(self) -> int:
        return self.packed.numel() + self.scales_zeros.numel() * 2


class PackedLinear:
    """An (N, K) weight packed for the CPU kernels (see the module docstring); use it through linear()."""

    def __init__(self, shape: tuple[int, int], planes: list[_Plane], qtype: str = "",
                 int8: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.shape = shape
        self.planes = planes
        self.qtype = qtype
        self.int8 = int8  # (codes (N, K) int8, scale (N,) fp32): the int8-rows form, instead of planes
        self.source: tuple[torch.Tensor, GGMLQuantizationType] | None = None  # GGUF rows for exact lookups

    # ------------------------------------------------------------ building
    @classmethod
    def from_blocks(cls, raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int],
                    rows_int8: bool = False) -> "PackedLinear":
        """From ggml bytes (N rows of K/block blocks), converted TILE_ROWS rows at a time; rows_int8: the
        embedding/head form (int8 per row of the exact decode)."""

        n, k = shape
        if k % GROUP:
            raise ValueError(f"packed matrices need K % {GROUP} == 0, got {shape}")
        _, block_bytes = GGML_QUANT_SIZES[qtype]
        rows = raw.reshape(n, -1)
        if rows_int8:
            out = cls.int8_from_tiles(dequantize(rows[r0:r0 + TILE_ROWS], qtype, (min(TILE_ROWS, n - r0), k))
                                      for r0 in range(0, n, TILE_ROWS))
            out.qtype = qtype.name
            out.source = (rows, qtype)  # a view of the memory-mapped file: lookups decode the few rows they need
            return out
        tiles = []
        for r0 in range(0, n, TILE_ROWS):
            tiles.append(_tile_affine(rows[r0:r0 + TILE_ROWS].reshape(-1, block_bytes), qtype, k))
        out = cls._assemble(tiles, shape)
        out.qtype = qtype.name
        return out

    @classmethod
    def int8_from_tiles(cls, tiles) -> "PackedLinear":
        """int8 per row (scale = row max / 127) from fp32 row tiles."""
        codes, scales = [], []
        for t in tiles:
            scale = t.abs().amax(1) / 127
            codes.append(torch.where(scale[:, None] > 0, t / scale.clamp_min(1e-30)[:, None], 0.0).round().to(torch.int8))
            scales.append(scale.float())
        codes_t = torch.cat(codes)
        return cls(tuple(codes_t.shape), [], int8=(codes_t, torch.cat(scales)))

    @classmethod
    def from_dense(cls, w: torch.Tensor, rows_int8: bool = False) -> "PackedLinear":
        """weights="q8": a dense matrix quantized as llama.cpp's Q8_0 (d = max|w|/127 per 32), then packed
        (or, rows_int8, as int8 rows)."""
        n, k = w.shape
        if rows_int8:
            out = cls.int8_from_tiles(w[r0:r0 + TILE_ROWS].float() for r0 in range(0, n, TILE_ROWS))
            out.qtype = "Q8_rows"
            return out
        out = cls._assemble([_q8_from_dense(w[r0:r0 + TILE_ROWS]) for r0 in range(0, n, TILE_ROWS)], (n, k))
        out.qtype = "Q8_0"
        return out

    @classmethod
    def _assemble(cls, tiles: list, shape: tuple[int, int]) -> "PackedLinear":
        pad = -shape[0] % BLOCK_N
        return cls(shape, [_Plane.from_tiles([t[p] for t in tiles], pad) for p in range(len(tiles[0]))])

    # ------------------------------------------------------------ using
    @property
    def padded_rows(self) -> int:
        return -(-self.shape[0] // BLOCK_N) * BLOCK_N

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Decode-sized products through the packed kernels; every row independent of the others."""
        n, k = self.shape
        lead = x.shape[:-1]
        if self.int8 is not None:
            y = torch._weight_int8pack_mm(x.reshape(-1, k).float(), self.int8[0], self.int8[1])
            return y.to(x.dtype).reshape(*lead, n)
        xb = x.reshape(-1, k).to(torch.bfloat16)
        y = None
        for p in self.planes:
            part = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, p.packed, GROUP, p.scales_zeros).float()
            y = part if y is None else y.add_(part)
        return y[:, :n].to(x.dtype).reshape(*lead, n)

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) as fp32 (start a multiple of 64): a prefill tile, or embedding rows."""
        k = self.shape[1]
        if self.int8 is not None:
            return self.int8[0][start:stop].float() * self.int8[1][start:stop, None]
        lo, hi = start // BLOCK_N * BLOCK_N, -(-stop // BLOCK_N) * BLOCK_N
        w = sum(p.dense(slice(lo, hi), k) for p in self.planes)
        return w[start - lo: stop - lo]

    def linear_tiled(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T in fp32 through TILE_ROWS-row dense tiles: prompt rows, at dense sgemm speed."""
        n = self.shape[0]
        y = x.new_empty(x.shape[0], n)
        for r0 in range(0, n, TILE_ROWS):
            r1 = min(r0 + TILE_ROWS, n)
            y[:, r0:r1] = F.linear(x, self.dense_rows(r0, r1).to(x.dtype))
        return y

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the matrix for token ids (an embedding table kept packed)."""
        if self.source is not None:  # exact, as the dense model's table, from the file's own rows
            raw, qtype = self.source
            return dequantize(raw.index_select(0, ids.reshape(-1)), qtype, (ids.numel(), self.shape[1])).view(
                *ids.shape, self.shape[1])
        if self.int8 is not None:
            return self.int8[0][ids].float() * self.int8[1][ids, None]
        uniq, inverse = torch.unique(ids, return_inverse=True)
        rows = torch.stack([self.dense_rows(int(i), int(i) + 1)[0] for i in uniq.tolist()])
        return rows[inverse]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.dense_rows(0, self.shape[0]).to(dtype)

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def nbytes(self) -> int:
        """Bytes resident and read by one decode-sized call."""
        if self.int8 is not None:
            return self.int8[0].numel() + self.int8[1].numel() * 4
        return sum(p.nbytes() for p in self.planes)

    memory_bytes = nbytes


def _tile_affine(blocks: torch.Tensor, qtype: GGMLQuantizationType, k: int):
    """One tile of blocks -> plane parts [(codes, scale, zero)]."""

    g = k // GROUP
    if qtype in (Q.Q4_0, Q.Q4_1):
        d = half(blocks, 0)
        zero = half(blocks, 2) + 8 * d if qtype == Q.Q4_1 else torch.zeros_like(d)
        qs = blocks[:, 4:] if qtype == Q.Q4_1 else blocks[:, 2:]
        codes = torch.cat([qs & 0x0F, qs >> 4], dim=1).view(-1, k)
        return [(codes, d.view(-1, g), zero.view(-1, g))]
    if qtype == Q.Q8_0:
        return _q8_planes(blocks[:, 2:].contiguous().view(torch.int8).to(torch.int16).view(-1, k),
                          half(blocks, 0).view(-1, g))
    if qtype in (Q.Q4_K, Q.Q5_K):
        q, s, m = (ggml_blocks.q4_k_affine if qtype == Q.Q4_K else ggml_blocks.q5_k_affine)(blocks)
        s, zero = s.reshape(-1, g), (8 * s - m).reshape(-1, g)
        q = q.reshape(-1, k)
        if qtype == Q.Q4_K:
            return [(q, s, zero)]
        return [(q & 0x0F, s, zero), ((q >> 4) + 8, 16 * s, torch.zeros_like(s))]
    return _q8_from_dense(dequantize(blocks, qtype, (blocks.shape[0] * GGML_QUANT_SIZES[qtype][0] // k, k)))


def _q8_from_dense(w: torch.Tensor):
    """Q8_0 as gguf.quants writes it (codes from the fp32 scale, rounded half away from zero; the scale
    stored as fp16), as two planes."""
    k = w.shape[1]
    x = w.float().view(-1, k // GROUP, GROUP)
    d = x.abs().amax(-1) / 127
    q = x * torch.where(d > 0, 1 / d, 0.0)[..., None]
    q = (q.sign() * (q.abs() + 0.5).floor()).clamp(-127, 127)
    return _q8_planes(q.to(torch.int16).view(-1, k), d.to(torch.float16).float())


def _q8_planes(q: torch.Tensor, d: torch.Tensor):
    """int8 codes (n, k) with per-32 scales d -> two int4 planes: q + 128 = low + 16 * high."""
    u = (q + 128).to(torch.uint8)
    return [(u & 0x0F, d, 8 * d), (u >> 4, 16 * d, torch.zeros_like(d))]


class PackedGroup:
    """Packed matrices stacked along the output dim (fused q|k|v, gate|up) whose formats may differ
    (Q4_K_M files mix Q4_K and Q6_K inside one layer): one call each, outputs concatenated."""

    def __init__(self, parts: list[PackedLinear]):
        self.parts = parts
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)

    def linear_tiled(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p.linear_tiled(x) for p in self.parts], dim=-1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.cat([p.dequantize(dtype) for p in self.parts])

    def numel(self) -> int:
        return sum(p.numel() for p in self.parts)

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)

    memory_bytes = nbytes


Packed = (PackedLinear, PackedGroup)


def stack(parts: list[PackedLinear]) -> PackedLinear | PackedGroup:
    """Fuse matrices along the output dim: one kernel call when their layouts agree (same plane count,
    no row padding between them), else a group of calls."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if not all(p.int8 is None and p.shape[0] % BLOCK_N == 0 and len(p.planes) == len(first.planes) for p in parts):
        return PackedGroup(parts)
    shape = (sum(p.shape[0] for p in parts), first.shape[1])
    kind = "+".join(dict.fromkeys(p.qtype for p in parts))
    planes = [_Plane(torch.cat([p.planes[i].packed for p in parts]),
                     torch.cat([p.planes[i].scales_zeros for p in parts], dim=1)) for i in range(len(first.planes))]
    return PackedLinear(shape, planes, qtype=kind)

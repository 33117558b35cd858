"""Packed (quantized) linear weights: one interface, one kernel per format.

Decode on a CPU is bound by weight bytes: fp32 copies of the default model's Q4_1 layers are 540 MB a
token, their 4-bit blocks ~70 MB. The formats ("q4": GGUF Q4_1/Q4_0, Q4_K's sub-blocks via
engine.model.repack; "q5": GGUF Q5_0/Q5_1; "q6": GGUF Q6_K's own super-blocks; "q4k": GGUF Q4_K's own
super-blocks; "q8": GGUF Q8_0, or any other weight quantized to it at load), their layouts and the kernel that
multiplies them are kernels.packed's; this module is the nn-level use of them. Without pagedeck's CPU kernels q4
falls back to torch's int4 kernel (bf16 activations), q5, q6 and q8 to dense rows.

In a model with dense prompt rows (engine.model.repack.keeps_dense_copy: small models, like the default
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
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType

import kernels
from kernels import cpu_ext
from kernels.packed import (GROUP, GROUP_ROWS, NO_SCALES, Q4K_BYTES, Q5_BYTES, Q6_BYTES, Q6_SUPER, check_blocks,
                             group_superblocks, groupable, int4_available, int4_matmul, int4_weight, pack_nibbles,
                             pad_scales, padded_scales, q4_dequantize, q4_supported, q5_dequantize, q5_pack,
                             q8_dequantize, q8_group, q8_pack, q8_quantize, q8_ungroup, qmatmul,
                             superblock_rows)

from . import scratch
from .ggml_blocks import dequantize

TILE_ROWS = 1024  # output rows per dense tile when no dense copy is kept
TILE_WEIGHTS = 1 << 20  # weights per conversion tile while loading (tile_rows)


def tile_rows(k: int) -> int:
    """Rows per conversion tile (repacking, re-quantizing): TILE_WEIGHTS weights (4 MB as fp32) whatever K, so
    a wide matrix (a 7B's 14336-wide down projection) never decodes more at once than a narrow one."""
    return max(1, TILE_WEIGHTS // k)


class PackedLinear:
    """An (N, K) weight in a packed format; use it through linear(). Subclasses own the layout.

    - `format`: its name; `shape`; `dense`: an fp32 (N, K) copy for prompt rows, or None (then prompt rows
      take dense tiles decoded by `dense_rows`).
    - `dense_rows(start, stop)` / `dequantize(dtype)`: the exact weights the blocks encode.
    - `blocks` -> (qs, d, m): the packed layout kernels.packed multiplies (its module docstring); they are
      what a decode-sized call reads (nbytes(), decode_bytes(), the roofline).
    Rows are independent: a row's output never depends on the other rows of the call (batch invariance)."""

    format = ""

    def __init__(self, shape: tuple[int, int], dense: torch.Tensor | None):
        self.shape = shape
        self.dense = dense  # fp32 copy for prompt rows (see the module docstring)
        self.jit_dense = False  # prompt rows take the exact weights decoded just in time (no copy kept)

    @property
    def prompt_dense(self) -> bool:
        """Whether prompt rows take the exact dense weights: the kept copy, or decoded just in time."""
        return self.dense is not None or self.jit_dense

    def dense_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        """Rows [start, stop) as fp32 written into `out` (a scratch view): the same bits as dense_rows."""
        out.copy_(self.dense_rows(start, stop))

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) as fp32."""
        raise NotImplementedError

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.dense_rows(0, self.shape[0]).to(dtype)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of token ids (an embedding table kept packed): from the dense copy, else decoded from the
        blocks."""
        if self.dense is not None:
            return F.embedding(ids, self.dense)
        return self._gather(ids.reshape(-1)).view(*ids.shape, self.shape[1])

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def blocks(self) -> tuple:
        """(qs, d, m) for qmatmul and kernels.decode_layers."""
        raise NotImplementedError

    def _fallback(self, x: torch.Tensor) -> torch.Tensor:
        return dense_product(x, self)

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def nbytes(self) -> int:
        """Bytes one decode-sized call reads (the packed blocks and their scales)."""
        return sum(t.numel() * t.element_size() for t in self.blocks if t is not None)

    def memory_bytes(self) -> int:
        return self.nbytes() + (0 if self.dense is None else self.dense.numel() * self.dense.element_size())

    def __call__(self, x: torch.Tensor, act: str | None = None) -> torch.Tensor:
        """x (..., K) -> (..., N), or (..., N/2) with act="swiglu"; every row independent of the others."""
        lead = x.shape[:-1]
        x2 = x if x.dim() == 2 else x.reshape(-1, self.shape[1])  # the decode path: lean, it runs ~120 times a step
        y = qmatmul(x2, self.blocks, act)
        if y is None:
            y = self._fallback(x2)
            if act == "swiglu":
                y = kernels.silu_mul(y)
        return y if x.dim() == 2 else y.view(*lead, y.shape[-1])


class AffineLinear(PackedLinear):
    """Codes with an fp16 scale and minimum per 32 weights, w = code * scale + minimum: the q4 and q5 formats,
    which differ only in how the codes are laid out (`_codes` packs them, `_decode` gives the weights back,
    `_decode_into` names the C++ decoder, `_weights` is K of a row of codes)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, keep_dense: bool = True):
        N, K = codes.shape
        check_blocks(N, K, scale)
        if minimum.shape != scale.shape:
            raise ValueError(f"minimum {tuple(minimum.shape)} must match scale {tuple(scale.shape)}")
        self._set(self._codes(codes).contiguous(), pad_scales(scale), pad_scales(minimum), keep_dense)

    @classmethod
    def from_packed(cls, qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, keep_dense: bool = False):
        """Adopt ready parts without copies: qs in the format's layout, scale and minimum from padded_scales()
        (the loader fills them tile by tile, so no (N, K) code temporaries exist)."""
        out = cls.__new__(cls)
        out._set(qs, scale, minimum, keep_dense)
        return out

    def _set(self, qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, keep_dense: bool) -> None:
        self.qs, self.scale, self.minimum = qs, scale, minimum
        super().__init__((qs.shape[0], self._weights(qs.shape[1])), None)
        if keep_dense:
            self.dense = self.dequantize()

    @classmethod
    def cat(cls, parts: list, consume: bool = False):
        """Stack along the output dim (fused q|k|v and gate|up): the packed bytes as they are (see _stack)."""
        dense, jit = _prompt_weights(parts, consume)
        out = cls.from_packed(_stack(parts, "qs", consume), pad_scales(_stack(parts, "scale", consume)),
                              pad_scales(_stack(parts, "minimum", consume)))
        out.dense, out.jit_dense = dense, jit
        return out

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        return self._decode(self.qs[start:stop], self.scale[start:stop], self.minimum[start:stop])

    def dense_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        ops = cpu_ext.ops()
        if ops is None:
            return super().dense_into(start, stop, out)
        getattr(ops, self._decode_into)(self.qs[start:stop], self.scale[start:stop], self.minimum[start:stop], out)

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        return self._decode(self.qs[ids], self.scale[ids], self.minimum[ids])

    @property
    def blocks(self) -> tuple:
        return self.qs, self.scale, self.minimum


class Q4Linear(AffineLinear):
    """4-bit codes (GGUF nibble order) with fp16 scale and minimum per 32 (engine.model.repack reads them from
    GGUF Q4_0/Q4_1 blocks without rounding, from Q4_K with fp16-rounded sub-block scales)."""

    format = "q4"
    _codes, _decode, _decode_into = staticmethod(pack_nibbles), staticmethod(q4_dequantize), "q4_dequantize_into"

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, keep_dense: bool = True):
        if not q4_supported():
            raise RuntimeError("no 4-bit matmul here (pagedeck's CPU kernels did not build and this torch has no "
                               "_weight_int4pack_mm_for_cpu); load the model with weights='dense'")
        super().__init__(codes, scale, minimum, keep_dense)

    @staticmethod
    def _weights(code_bytes: int) -> int:
        return code_bytes * 2

    def _set(self, qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, keep_dense: bool) -> None:
        self._int4 = None  # torch's packing, built only if the fallback runs
        super()._set(qs, scale, minimum, keep_dense)

    def _fallback(self, x: torch.Tensor) -> torch.Tensor:
        if not int4_available() or x.device.type != "cpu":
            return super()._fallback(x)
        if self._int4 is None:
            self._int4 = int4_weight(self.qs, self.scale, self.minimum)
        return int4_matmul(x, self._int4)


class Q5Linear(AffineLinear):
    """5-bit codes with fp16 scale and minimum per 32: GGUF Q5_0 (minimum -16 d) and Q5_1 held exactly at 5 bits
    a weight (as q8 they took 8.5); kernels.packed.q5_layout is the byte order. Without the CPU kernels its
    products take dense rows."""

    format = "q5"
    _codes, _decode, _decode_into = staticmethod(q5_pack), staticmethod(q5_dequantize), "q5_dequantize_into"

    @staticmethod
    def _weights(code_bytes: int) -> int:
        return code_bytes // Q5_BYTES * GROUP


class Q8Linear(PackedLinear):
    """int8 codes with an fp16 scale per 32: w = code * scale (GGUF Q8_0, or quantize() of any weight);
    kept as u8 code + 128 for the kernel.

    group() regroups the rows 16 at a time in place (kernels.packed's q8g: the GEMM tiles' own layout, the same
    bits, no panel to unpack per call; `grouped` says which): for the output head, whose 8-row calls spent
    most of their time unpacking panels. Row access (dense_rows, embedding rows) reads either layout."""

    format = "q8"

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, dense: torch.Tensor | None = None,
                 keep_dense: bool = True):
        N, K = codes.shape
        check_blocks(N, K, scale)
        if codes.dtype != torch.int8:
            raise ValueError(f"Q8Linear codes must be int8, got {codes.dtype}")
        self._set(q8_pack(codes), pad_scales(scale), dense, keep_dense)

    @classmethod
    def from_packed(cls, qs: torch.Tensor, scale: torch.Tensor, dense: torch.Tensor | None = None,
                    keep_dense: bool = False) -> "Q8Linear":
        """Adopt ready parts without copies: qs (N, K) uint8 = code + 128, scale from padded_scales()."""
        out = cls.__new__(cls)
        out._set(qs, scale, dense, keep_dense)
        return out

    @classmethod
    def requantize(cls, p: PackedLinear) -> "Q8Linear":
        """Any packed matrix as q8 of its exact weights, a tile of rows at a time (its dense copy kept as is)."""
        N, K = p.shape
        rows = tile_rows(K)
        qs, scale = torch.empty(N, K, dtype=torch.uint8), padded_scales(N, K // GROUP)
        ops = cpu_ext.ops()
        if ops is not None and isinstance(p, Q4Linear):  # kernels/cpu/repack.cpp: same bits, one pass
            ops.q4_to_q8(p.qs, p.scale, p.minimum, qs, scale)
            return cls.from_packed(qs, scale, p.dense, p.dense is not None)
        if ops is not None and isinstance(p, Q6Linear):
            ops.q6_k_to_q8(p.qs, qs, scale)
            return cls.from_packed(qs, scale, p.dense, p.dense is not None)
        if ops is not None and isinstance(p, Q4KLinear):  # through q4, the bits mixed groups had before q4k
            q4 = p.to_q4()
            ops.q4_to_q8(q4.qs, q4.scale, q4.minimum, qs, scale)
            return cls.from_packed(qs, scale, p.dense, p.dense is not None)
        for r0 in range(0, N, rows):
            codes, scale[r0:r0 + rows] = q8_quantize(p.dense_rows(r0, min(r0 + rows, N)))
            qs[r0:r0 + rows] = q8_pack(codes)
        return cls.from_packed(qs, scale, p.dense, p.dense is not None)

    def _set(self, qs: torch.Tensor, scale: torch.Tensor, dense: torch.Tensor | None, keep_dense: bool) -> None:
        self.qs, self.scale = qs, scale  # qs = code + 128: the kernel multiplies u8 by s8
        self.grouped = False
        super().__init__((qs.shape[0], qs.shape[1]), None)
        if keep_dense:
            self.dense = dense if dense is not None else self.dequantize()

    @classmethod
    def quantize(cls, w: torch.Tensor, keep_dense: bool = True) -> "Q8Linear":
        """Symmetric per-32 int8 (GGUF Q8_0's rule); a Q8_0 weight dequantized to fp32 comes back unchanged.
        The dense copy kept is `w` itself (prompt rows stay the checkpoint's own weights)."""
        N, K = w.shape
        if K % GROUP:
            raise ValueError(f"q8 packing needs K % {GROUP} == 0, got {tuple(w.shape)}")
        codes, scale = q8_quantize(w)
        return cls(codes, scale, w.float() if keep_dense else None, keep_dense)

    def group(self) -> bool:
        """Regroup the rows in place where the CPU kernels run, the weights are on the CPU and whole groups fill
        each half (kernels.packed.groupable); whether it is grouped now."""
        if not self.grouped and self.qs.device.type == "cpu" and groupable(self.shape[0]):
            self.qs, self.scale = q8_group(self.qs, self.scale)
            self.grouped = True
        return self.grouped

    def rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(qs, scale) of rows [start, stop) in row order (scale unpadded)."""
        if not self.grouped:
            return self.qs[start:stop], self.scale[start:stop]
        g0 = start // GROUP_ROWS
        qs, scale = q8_ungroup(self.qs[g0:-(-stop // GROUP_ROWS)], self.scale[g0:-(-stop // GROUP_ROWS)])
        lo = start - g0 * GROUP_ROWS
        return qs[lo:lo + stop - start], scale[lo:lo + stop - start]

    @classmethod
    def cat(cls, parts: list["Q8Linear"], consume: bool = False) -> "Q8Linear":
        """Stack along the output dim (fused q|k|v and gate|up): the packed bytes as they are (see _stack)."""
        if any(p.grouped for p in parts):
            raise ValueError("grouped q8 matrices are not stacked: stack the rows, then group the result")
        dense, jit = _prompt_weights(parts, consume)
        out = cls.from_packed(_stack(parts, "qs", consume), pad_scales(_stack(parts, "scale", consume)), dense,
                              dense is not None)
        out.jit_dense = jit
        return out

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        return q8_dequantize(*self.rows(start, stop))

    def dense_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        ops = cpu_ext.ops()
        if ops is None or self.grouped:
            return super().dense_into(start, stop, out)
        ops.q8_dequantize_into(self.qs[start:stop], self.scale[start:stop], out)

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.grouped:
            return q8_dequantize(self.qs[ids], self.scale[ids])
        g, r = ids // GROUP_ROWS, ids % GROUP_ROWS
        nb = self.shape[1] // GROUP  # a group's codes are [block][step][row][4 bytes], its scales [block][row]
        qs = self.qs.view(-1, nb, 8, GROUP_ROWS, 4)[g, :, :, r].reshape(ids.numel(), self.shape[1])
        return q8_dequantize(qs, self.scale.view(-1, nb, GROUP_ROWS)[g, :, r])

    @property
    def blocks(self) -> tuple:
        return self.qs, self.scale, None


class SuperBlockLinear(PackedLinear):
    """A GGUF K-quant kept as the file stores it: rows of BLOCK_BYTES-byte super-blocks of Q6_SUPER weights
    each, their scales inside the blocks, decoded exactly as gguf does.

    A format with GROUPS (q4k) keeps, where the CPU kernels run and N % 32 == 0 (kernels.packed.groupable), its rows regrouped 16 at a
    time in `qs` (kernels.packed's q4k16: the same bytes, the same bits, a decode kernel without horizontal
    reductions); `grouped` says which. Give rows, or groups with grouped=True (the loader writes the file's
    rows straight into groups, kernels.packed.group_superblocks)."""

    format: str
    BLOCK_BYTES: int
    QTYPE: GGMLQuantizationType
    GROUPS = False

    def __init__(self, qs: torch.Tensor, dense: torch.Tensor | None = None, grouped: bool = False):
        n, row_bytes = qs.shape
        if grouped:
            n, row_bytes = n * GROUP_ROWS, row_bytes // GROUP_ROWS
        if qs.dtype != torch.uint8 or row_bytes % self.BLOCK_BYTES or (grouped and qs.shape[1] % GROUP_ROWS):
            raise ValueError(f"{self.format} {'groups' if grouped else 'rows'} must be uint8 {self.QTYPE.name} "
                             f"super-blocks ({self.BLOCK_BYTES} bytes each{', 16 rows a group' if grouped else ''}), "
                             f"got {qs.dtype} {tuple(qs.shape)}")
        self.qs, self.grouped = qs.contiguous(), grouped
        super().__init__((n, row_bytes // self.BLOCK_BYTES * Q6_SUPER), dense)
        if not grouped and self.GROUPS and groupable(n):
            groups = self.empty_groups(n, self.shape[1])
            group_superblocks(self.qs, groups, self.BLOCK_BYTES)
            self.qs, self.grouped = groups, True

    @classmethod
    def empty_groups(cls, n: int, k: int) -> torch.Tensor:
        """Uninitialized groups for n rows of k weights (n % 16 == 0), for the loader to fill."""
        return torch.empty(n // GROUP_ROWS, k // Q6_SUPER * GROUP_ROWS * cls.BLOCK_BYTES, dtype=torch.uint8)

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
        """Stack along the output dim: the super-blocks as they are (see _stack), groups where every part is
        grouped, else the parts' rows."""
        dense, jit = _prompt_weights(parts, consume)
        if all(p.grouped for p in parts):
            out = cls(_stack(parts, "qs", consume), dense, grouped=True)
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
    """GGUF Q6_K super-blocks (kernels.packed's q6): w = d * sc * (code - 32), 6.56 bits a weight (as q8 they
    took 8.5)."""

    format = "q6"
    BLOCK_BYTES = Q6_BYTES
    QTYPE = GGMLQuantizationType.Q6_K


class Q4KLinear(SuperBlockLinear):
    """GGUF Q4_K super-blocks (kernels.packed's q4k): w = d * sc * code - dmin * m, 4.5 bits a weight (as q4
    they took 5, with fp16-rounded d * sc and dmin * m). Multiplied as llama.cpp's Q4_K x Q8_K: activations
    quantized per 256, the 6-bit scales and minimums applied as integers (kernels/cpu/q4k.h)."""

    format = "q4k"
    BLOCK_BYTES = Q4K_BYTES
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


class PartsLinear(PackedLinear):
    """Row-stacked parts each kept in its own format (a Q4_K_M file's Q4_K q and k beside its Q6_K v, fused as
    q|k|v): each part multiplies with its own kernel and the outputs are joined. The group reads the file's
    own bytes; as one q8 matrix (the rule where prompt rows keep dense weights, cat_packed) it would read ~1.8x
    as many a token and need re-quantizing at load. `blocks` is every part's (qs, d, m) in order."""

    format = "parts"

    def __init__(self, parts: list[PackedLinear]):
        if len({p.shape[1] for p in parts}) != 1 or any(p.prompt_dense for p in parts):
            raise ValueError("PartsLinear parts must share K and keep no dense prompt rows")
        self.parts = list(parts)
        super().__init__((sum(p.shape[0] for p in parts), parts[0].shape[1]), None)

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        out, row = [], 0
        for p in self.parts:
            lo, hi = max(start, row), min(stop, row + p.shape[0])
            if lo < hi:
                out.append(p.dense_rows(lo - row, hi - row))
            row += p.shape[0]
        return torch.cat(out)

    @property
    def blocks(self) -> tuple:
        return tuple(t for p in self.parts for t in p.blocks)

    def __call__(self, x: torch.Tensor, act: str | None = None) -> torch.Tensor:
        return _act(torch.cat([p(x) for p in self.parts], dim=-1), act)


def _stack(parts: list[PackedLinear], attr: str, consume: bool) -> torch.Tensor:
    """torch.cat of the parts' `attr` tensors along rows. With `consume` (the loader, which gives the parts up)
    each part's tensor is dropped as soon as it is copied; the result's pages are touched only as they fill,
    so fusing a 7B's gate|up holds one part twice at most, not the whole fused matrix."""
    if not consume:
        return torch.cat([getattr(p, attr) for p in parts])
    first = getattr(parts[0], attr)
    out = torch.empty(sum(getattr(p, attr).shape[0] for p in parts), *first.shape[1:], dtype=first.dtype)
    row = 0
    for p in parts:
        t = getattr(p, attr)
        out[row:row + t.shape[0]] = t
        row += t.shape[0]
        setattr(p, attr, None)
    return out


def _prompt_weights(parts: list[PackedLinear], consume: bool) -> tuple[torch.Tensor | None, bool]:
    """What stacked parts give prompt rows: their kept dense copies stacked (where every part keeps one), and
    whether every part decodes just in time (the cat methods set both on the result)."""
    dense = _stack(parts, "dense", consume) if all(p.dense is not None for p in parts) else None
    return dense, all(p.jit_dense for p in parts)


def cat_packed(parts: list[PackedLinear], consume: bool = False) -> PackedLinear:
    """Stack packed weights along the output dim: one format as is; mixed formats (a Q4_K_M file's Q4_K q/k
    beside a Q6_K v) stay each in its own (PartsLinear) where the kernels run and no part keeps dense prompt
    rows, else all become q4 (Q4_K beside Q4_0/Q4_1) or q8, each part re-quantized from its exact weights
    (engine.model.repack.kernel_formats, the estimate's rule). `consume`: the parts are given up and emptied
    while they are copied (loading; see _stack)."""
    kinds = {type(p) for p in parts}
    if len(kinds) > 1 and cpu_ext.ops() is not None and not any(p.prompt_dense for p in parts):
        return PartsLinear(parts)
    if any(p.prompt_dense for p in parts) and (len(kinds) > 1 or len({p.jit_dense for p in parts}) > 1):
        for p in parts:  # a converted part no longer decodes to its exact weights: the group keeps its copy
            if p.jit_dense:
                p.dense, p.jit_dense = p.dequantize(), False
    if len(kinds) == 1:
        return kinds.pop().cat(parts, consume)
    if kinds == {Q4Linear, Q4KLinear} and cpu_ext.ops() is not None:  # Q4_K beside Q4_0/Q4_1: all q4, as before q4k
        return Q4Linear.cat([p if isinstance(p, Q4Linear) else p.to_q4() for p in parts], consume)
    as_q8 = [p if isinstance(p, Q8Linear) else Q8Linear.requantize(p) for p in parts]
    return Q8Linear.cat(as_q8, consume)  # a kept dense copy stays each part's exact weights


class RowSplit:
    """Which rows of a step take dense weights (`prompt_rows`: prompt tokens) and which the packed kernel."""

    def __init__(self, prompt_rows: torch.Tensor | None, T: int):
        self.prompt_rows = prompt_rows
        n = 0 if prompt_rows is None else prompt_rows.numel()
        self.all_prompt = n == T > 0
        self.prompt = prompt_rows if 0 < n < T else None
        if self.prompt is not None:
            keep = torch.ones(T, dtype=torch.bool, device=prompt_rows.device)
            keep[prompt_rows] = False
            self.generated = keep.nonzero().reshape(-1)

    @classmethod
    def of_batch(cls, prompt_rows: torch.Tensor | None, cu_q: torch.Tensor) -> "RowSplit":
        """The step's prompt rows take dense weights (cu_q: (B+1,) offsets; its last is the row count)."""
        T = int(cu_q[-1])
        if prompt_rows is None or prompt_rows.numel() == 0:
            return cls(None, T)
        return cls(prompt_rows, T)

    @classmethod
    def of_rows(cls, prompt_rows: torch.Tensor | None, T: int, rows: torch.Tensor) -> "RowSplit":
        """The split of x[rows] (e.g. the logit rows) given the prompt rows of x."""
        if prompt_rows is None or prompt_rows.numel() == 0:
            return cls(None, rows.numel())
        is_prompt = torch.zeros(T, dtype=torch.bool, device=rows.device)
        is_prompt[prompt_rows] = True
        return cls(is_prompt[rows].nonzero().reshape(-1), rows.numel())


def _act(y: torch.Tensor, act: str | None) -> torch.Tensor:
    return kernels.silu_mul(y) if act == "swiglu" else y


def dense_product(x: torch.Tensor, w: PackedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T with W's exact dense weights: the kept copy, else decoded just in time into a reused scratch
    buffer (`scratch`): the whole matrix where it fits, so F.linear sees the same operands as with a copy and
    gives the same bits; a wider matrix (the default model's 49152-row tied head) in slabs of rows aligned so
    that MKL's sgemm gives the whole matrix's bits too (slabs of 7281 rows did not at 1-7 rows; multiples of
    1024 did at 1-96 rows, measured; the tests compare the logits bit for bit)."""
    if w.dense is not None:
        return F.linear(x, w.dense.to(x.dtype), bias)
    N, K = w.shape
    if w.jit_dense:
        step = scratch.MAX_WEIGHTS // K  # slabs start on multiples of 1024 rows (64 for very wide K): MKL's
        step = step // 1024 * 1024 if step >= 1024 else max(64, step // 64 * 64)  # sgemm then gives the whole
        buf = scratch.get(min(step, N) * K)  # matrix's bits
        if step >= N:
            weights = buf[: N * K].view(N, K)
            w.dense_into(0, N, weights)
            return F.linear(x, weights.to(x.dtype), bias)
        y = x.new_empty(x.shape[0], N)
        for r0 in range(0, N, step):
            r1 = min(r0 + step, N)
            weights = buf[: (r1 - r0) * K].view(r1 - r0, K)
            w.dense_into(r0, r1, weights)
            y[:, r0:r1] = F.linear(x, weights.to(x.dtype), None if bias is None else bias[r0:r1])
        return y
    y = x.new_empty(x.shape[0], N)
    for r0 in range(0, N, TILE_ROWS):
        r1 = min(r0 + TILE_ROWS, N)
        y[:, r0:r1] = F.linear(x, w.dense_rows(r0, r1).to(x.dtype), None if bias is None else bias[r0:r1])
    return y


def linear(x: torch.Tensor, w: "torch.Tensor | PackedLinear", bias: torch.Tensor | None = None,
           rows: RowSplit | None = None, act: str | None = None) -> torch.Tensor:
    """F.linear for dense or packed weights (act="swiglu": silu(gate) * up of a [gate | up] weight); for
    packed weights, `rows` sends prompt rows through dense weights. A generated row takes the same path
    whatever else is in the step."""
    if not isinstance(w, PackedLinear):
        return _act(F.linear(x, w, bias), act)

    def packed(v: torch.Tensor) -> torch.Tensor:  # the kernel's epilogue only applies without a bias
        return w(v, act) if bias is None else _act(w(v) + bias, act)

    if rows is None or not (rows.all_prompt or rows.prompt is not None):
        return packed(x)
    if rows.all_prompt:
        return _act(dense_product(x, w, bias), act)
    y = x.new_empty(x.shape[0], w.shape[0] // 2 if act == "swiglu" else w.shape[0])
    y.index_copy_(0, rows.prompt, _act(dense_product(x.index_select(0, rows.prompt), w, bias), act))
    y.index_copy_(0, rows.generated, packed(x.index_select(0, rows.generated)))
    return y

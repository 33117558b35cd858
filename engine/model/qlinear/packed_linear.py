"""PackedLinear, the interface every packed weight format implements (engine.model.qlinear's format modules),
and what stacking parts of one format shares: rows of tensors stacked without holding two copies, and the
parts' prompt-row weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels
from kernels import cpu_ext, formats
from kernels.packed import qmatmul

from .dense_weights import dense_product

TILE_WEIGHTS = 1 << 20  # weights per conversion tile while loading (tile_rows)


def tile_rows(k: int) -> int:
    """Rows per conversion tile (repacking, re-quantizing): TILE_WEIGHTS weights (4 MB as fp32) whatever K, so
    a wide matrix (a 7B's 14336-wide down projection) never decodes more at once than a narrow one."""
    return max(1, TILE_WEIGHTS // k)


def apply_act(y: torch.Tensor, act: str | None) -> torch.Tensor:
    """The fused epilogue done apart: silu(gate) * up of a [gate | up] output with act="swiglu", through the
    kernel's own function where the CPU kernels run (so a [gate | up] held in parts, or given a bias, gets the
    bits the fused matrix's epilogue gives), else kernels.silu_mul."""
    if act != "swiglu":
        return y
    ops = cpu_ext.ops()
    if ops is None or y.device.type != "cpu" or y.dtype != torch.float32:
        return kernels.silu_mul(y)
    out = ops.silu_mul(y.reshape(-1, y.shape[-1]))
    return out.view(*y.shape[:-1], out.shape[-1])


class PackedLinear:
    """An (N, K) weight in a packed format; use it through linear(). Subclasses own the layout.

    - `format`: its name; `shape`; `dense`: an fp32 (N, K) copy for prompt rows, or None (then prompt rows
      take dense tiles decoded by `dense_rows`).
    - `dense_rows(start, stop)` / `dequantize(dtype)`: the exact weights the blocks encode.
    - `blocks` -> (qs, d, m): the packed layout kernels.packed multiplies (its module docstring); they are
      what a decode-sized call reads (nbytes(), decode_bytes(), the roofline).
    Rows are independent: a row's output never depends on the other rows of the call (batch invariance)."""

    format = ""
    spec: formats.Format  # the format's entry in kernels.formats (its layout, sizes and C++ id)

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

    @property
    def kernel_id(self) -> int:
        """The C++ kernels' id of the blocks' layout (kernels.formats): passed with them into every call."""
        return self.spec.id(getattr(self, "grouped", False))

    @property
    def kernel_ids(self) -> list[int]:
        """The kernel id of each part's (qs, d, m) in `blocks` (one but for PartsLinear)."""
        return [self.kernel_id]

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
        y = qmatmul(x2, self.blocks, self.kernel_id, act)
        if y is None:
            y = apply_act(self._fallback(x2), act)
        return y if x.dim() == 2 else y.view(*lead, y.shape[-1])


def stack_parts(parts: list[PackedLinear], attr: str, consume: bool) -> torch.Tensor:
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


def prompt_weights(parts: list[PackedLinear], consume: bool) -> tuple[torch.Tensor | None, bool]:
    """What stacked parts give prompt rows: their kept dense copies stacked (where every part keeps one), and
    whether every part decodes just in time (the cat methods set both on the result)."""
    dense = stack_parts(parts, "dense", consume) if all(p.dense is not None for p in parts) else None
    return dense, all(p.jit_dense for p in parts)

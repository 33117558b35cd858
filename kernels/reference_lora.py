"""Per-row LoRA (Punica's segmented gather), the torch path: the CPU engine runs it, Triton is tested against it.

A step's rows come in segments (consecutive rows that share an adapter set); the columns of a stacked
shrink matrix belong to adapters. `col_scale[s, c]` is the scale segment s gives column c's adapter (0 when
the set lacks it). Shrink computes `out[t, c] = col_scale[seg(t), c] * (x[t] @ a[:, c])`; expand adds
`s @ b` into y. Rows therefore only ever meet their own adapters.

How the torch path gathers: it computes every row against every column of the stack and zeroes the
foreign ones with a (T, R) mask built once per plan. A decode step is bound by reading the weights, which
any method reads once per distinct adapter; the masked product reads them once too and costs three calls
per target, where a per-segment loop would cost two per segment (and each call ~5 us on a CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class LoRAPlan:
    """One step's row segments and the scales of one column layout: built once, used by every layer.

    seg_rows: rows per segment (host ints), or None for one segment of however many rows come.
    col_scale: (S, R) scales, on the weights' device.
    mask: the torch path's (T, R) or (1, R) factor; None when every scale is exactly 1 (one segment).
    seg_start: the Triton path's (S+1,) int32 row offsets on the device (None: one segment).
    """

    seg_rows: tuple[int, ...] | None
    col_scale: torch.Tensor
    mask: torch.Tensor | None
    seg_start: torch.Tensor | None
    max_rows: int


def lora_plan(col_scale: torch.Tensor, seg_rows: Sequence[int] | None = None,
              device: torch.device | str | None = None) -> LoRAPlan:
    """Lay out one step's segments from host-side scales (so no check here waits for a device).

    col_scale: (S, R) on the CPU; seg_rows: rows per segment, or None for one segment (then S == 1).
    device: where the weights live (default: the CPU)."""
    if col_scale.dim() != 2 or col_scale.device.type != "cpu":
        raise ValueError(f"col_scale must be a CPU (segments, columns) tensor, got {tuple(col_scale.shape)} "
                         f"on {col_scale.device}")
    device = torch.device(device) if device is not None else col_scale.device
    n_seg = col_scale.shape[0]
    on_device = col_scale.to(device, non_blocking=True)
    if seg_rows is None:
        if n_seg != 1:
            raise ValueError(f"without seg_rows there is one segment, but col_scale has {n_seg} rows")
        mask = None if bool((col_scale == 1).all()) else on_device
        return LoRAPlan(None, on_device, mask, None, 0)
    rows = tuple(int(n) for n in seg_rows)
    if len(rows) != n_seg or any(n < 0 for n in rows):
        raise ValueError(f"seg_rows {rows} must give a row count >= 0 for each of the {n_seg} segments")
    start = torch.zeros(n_seg + 1, dtype=torch.int32)
    start[1:] = torch.cumsum(torch.tensor(rows, dtype=torch.int32), 0)
    # the torch path's per-row gather (Triton reads seg_start and col_scale instead): built on every device,
    # since the torch path also runs where Triton is off, and a plan without it would apply no adapter masks
    mask = col_scale.repeat_interleave(torch.tensor(rows), dim=0, output_size=sum(rows)).to(device, non_blocking=True)
    return LoRAPlan(rows, on_device, mask, start.to(device, non_blocking=True), max(rows, default=0))


def check_lora_args(x: torch.Tensor, a: torch.Tensor, plan: LoRAPlan) -> None:
    if x.dim() != 2 or a.dim() != 2 or x.shape[1] != a.shape[0]:
        raise ValueError(f"lora_shrink wants x (T, in) and a (in, R), got {tuple(x.shape)} and {tuple(a.shape)}")
    if plan.col_scale.shape[1] != a.shape[1]:
        raise ValueError(f"the plan has {plan.col_scale.shape[1]} columns, the stack {a.shape[1]}")
    if plan.seg_rows is not None and sum(plan.seg_rows) != x.shape[0]:
        raise ValueError(f"the plan's segments hold {sum(plan.seg_rows)} rows, x has {x.shape[0]}")


def lora_shrink(x: torch.Tensor, a: torch.Tensor, plan: LoRAPlan) -> torch.Tensor:
    """(T, R): every row through every column, then each row keeps (and scales) its own adapters' columns."""
    check_lora_args(x, a, plan)
    out = x @ a
    if plan.mask is not None:
        out.mul_(plan.mask)
    return out


def lora_expand(s: torch.Tensor, b: torch.Tensor, y: torch.Tensor, plan: LoRAPlan, col0: int = 0) -> None:
    """y += s @ b in place; s holds the plan's columns col0.. (zero where a row's set lacks the adapter)."""
    if s.shape[0] != y.shape[0] or s.shape[1] != b.shape[0] or b.shape[1] != y.shape[1]:
        raise ValueError(f"lora_expand wants s (T, r), b (r, n), y (T, n); got {tuple(s.shape)}, "
                         f"{tuple(b.shape)}, {tuple(y.shape)}")
    if col0 < 0 or col0 + s.shape[1] > plan.col_scale.shape[1]:
        raise ValueError(f"columns {col0}..{col0 + s.shape[1]} are outside the plan's {plan.col_scale.shape[1]}")
    y.addmm_(s, b)

"""LoRA adapters in PEFT's on-disk format, applied on the fly as low-rank updates after each fused linear.

Why not merge them into the weights: swapping adapters must be instant, the base weights stay shared and
untouched, and each job may run its own adapters in the same batch. The cost stays small because the
adapters one step uses are stacked per fused linear (q|k|v, o, gate|up, down) into one shrink matrix and
dense per-module expand blocks (`LoRAStack`): every hook is one shrink and one expand per module however
many adapters are active; which rows meet which adapters (and with which scale) is the plan's business
(kernels.lora_plan: one set for every row here, per-job sets in engine/model/lora/batch.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

import torch

import kernels

from ...contract.adapters import check_lora_scale
from .adapter import KIND_MODULES, Geometry, LoRA, check_fits


class LoRAApply(Protocol):
    """What Model.forward(batch, cache, lora=...) takes: adds low-rank updates to the flat rows of one step.

    The model calls add() after each fused linear with that linear's input x (T, in) and output y (T, out).
    LoRASet applies one adapter set to every row; LoRABatch (engine.model.lora.batch) gives each job's rows their own
    set (Punica-style), through the same stacks and kernels.
    """

    def add(self, layer: int, kind: str, x: torch.Tensor, y: torch.Tensor) -> None: ...

def combine(pairs: Iterable[tuple[LoRA, float]]) -> list[tuple[LoRA, float]]:
    """One entry per adapter (a repeated adapter's scales add up), in a canonical order (by content), so
    equal sets stack, compute and hash alike whatever order they were named in."""
    merged: dict[int, list] = {}
    for lora, scale in pairs:
        entry = merged.setdefault(id(lora), [lora, 0.0])
        entry[1] += float(scale)
    return sorted(((lora, scale) for lora, scale in merged.values()), key=lambda p: (p[0].content_hash, p[1]))


def adapter_identity(pairs: Iterable[tuple[LoRA, float]]) -> tuple | None:
    """Hashable, repr-stable identity of an adapter set for the page table's root hash: K/V computed under
    it depends on the adapters' content and scales (not their names or paths). None: no adapters."""
    out = tuple((lora.content_hash, scale) for lora, scale in combine(pairs))
    return out or None


class LoRAStack:
    """Distinct adapters' weights stacked per (layer, fused linear); built once per adapter combination.

    Columns are grouped by module, then by adapter: the shrink is one matmul over the fused linear's input
    for every module and adapter, and each module's expand is one dense (rank, out) block added into its
    slice of the output (no zero blocks to read). B carries each adapter's alpha/r; the scale a set gives
    an adapter lives in the plan, so the stack serves every set of the same adapters.
    """

    def __init__(self, model, adapters: Sequence[LoRA]):
        geometry = Geometry.of(model)
        for lora in adapters:
            check_fits(model, lora)
        self.adapters = tuple(adapters)
        self.device = model.device
        layouts: dict[tuple[int, ...], int] = {}
        self.entries: dict[tuple[int, str], tuple[torch.Tensor, tuple, int]] = {}
        for layer in range(geometry.num_layers):
            for kind, modules in KIND_MODULES.items():
                a_parts, owner, expands = [], [], []
                for module in modules:
                    _, _, n_out, offset = geometry.module(module)
                    b_parts, c0 = [], len(owner)
                    for j, lora in enumerate(self.adapters):
                        if (layer, module) in lora.weights:
                            a, b, scaling = lora.weights[(layer, module)]
                            a_parts.append(a.t())
                            b_parts.append((b.float().t() * scaling).to(model.dtype))
                            owner += [j] * a.shape[0]
                    if b_parts:
                        expands.append((offset, n_out, c0, len(owner), torch.cat(b_parts).contiguous()))
                if a_parts:
                    a_t = torch.cat(a_parts, 1).to(model.device, model.dtype).contiguous()
                    layout = layouts.setdefault(tuple(owner), len(layouts))
                    self.entries[(layer, kind)] = (a_t, tuple(expands), layout)
        # per column layout: which adapter owns each column (host side: plans are built on the host)
        self.layouts = [torch.tensor(owner, dtype=torch.long) for owner in layouts]

    def plans(self, adapter_scale: torch.Tensor, seg_rows: Sequence[int] | None) -> list[kernels.LoRAPlan]:
        """One plan per column layout, from (segments, adapters) scales on the host."""
        return [kernels.lora_plan(adapter_scale[:, owner], seg_rows, self.device) for owner in self.layouts]

    def apply(self, layer: int, kind: str, x: torch.Tensor, y: torch.Tensor,
              plan_of: Callable[[int], kernels.LoRAPlan]) -> None:
        entry = self.entries.get((layer, kind))
        if entry is None:
            return
        a_t, expands, layout = entry
        plan = plan_of(layout)
        s = kernels.lora_shrink(x, a_t, plan)
        for offset, n_out, c0, c1, b in expands:
            out = y if n_out == y.shape[1] else y[:, offset : offset + n_out]
            kernels.lora_expand(s if c1 - c0 == s.shape[1] else s[:, c0:c1], b, out, plan, c0)

    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + sum(e[4].numel() * e[4].element_size() for e in ex)
                   for a, ex, _ in self.entries.values())


class LoRASet:
    """Adapters with their scales, applied to every row of a batch (a LoRAApply; `set_loras`'s meaning)."""

    def __init__(self, model, adapters: list[LoRA], scales: list[float]):
        self.adapters = list(adapters)
        self.scales = list(scales)
        pairs = combine(zip(self.adapters, self.scales))
        self.stack = LoRAStack(model, [lora for lora, _ in pairs])
        self._plans = self.stack.plans(torch.tensor([[s for _, s in pairs]], dtype=torch.float32), None)

    @classmethod
    def build(cls, model, loras: Any, scales: float | Iterable[float] | None = None) -> "LoRASet | None":
        """A LoRASet from a LoRA, a path, or a list of them (None or [] -> None: no adapters)."""
        items = adapter_list(loras)
        if not items:
            if scales is not None and not (isinstance(scales, (list, tuple)) and not scales):
                raise ValueError("scales were given but no LoRA adapters")
            return None
        adapters = [item if isinstance(item, LoRA) else LoRA.load(item, model) for item in items]
        return cls(model, adapters, scale_list(scales, len(adapters)))

    def identity(self) -> tuple | None:
        """The page table's identity of this set (adapter_identity)."""
        return adapter_identity(zip(self.adapters, self.scales))

    def add(self, layer: int, kind: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """y += scale * (x @ A^T) @ (alpha/r * B)^T for every adapter on this layer's `kind` linear, in place."""
        self.stack.apply(layer, kind, x, y, self._plans.__getitem__)

    def __repr__(self) -> str:
        return "LoRASet(" + ", ".join(f"{a.name}*{s:g}" for a, s in zip(self.adapters, self.scales)) + ")"


def adapter_list(loras: Any) -> list:
    """A LoRA, a path, or a list of them, as a list (None -> []); anything else is a TypeError."""
    if loras is None:
        return []
    if isinstance(loras, (LoRA, str, Path)):
        return [loras]
    if isinstance(loras, (list, tuple)):
        for item in loras:
            if not isinstance(item, (LoRA, str, Path)):
                raise TypeError(f"each LoRA must be a LoRA or a path, not {type(item).__name__}")
        return list(loras)
    raise TypeError(f"loras must be a LoRA, a path, a list of them or None, not {type(loras).__name__}")


def scale_list(scales: float | Iterable[float] | None, n: int) -> list[float]:
    if scales is None:
        values = [1.0] * n
    elif isinstance(scales, (int, float)) and not isinstance(scales, bool):
        values = [float(scales)] * n
    else:
        values = list(scales)
        if len(values) != n:
            raise ValueError(f"got {len(values)} LoRA scales for {n} adapters")
    return [check_lora_scale(s) for s in values]

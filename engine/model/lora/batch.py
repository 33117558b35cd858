"""LoRABatch: each job's rows through its own adapters in one forward (Punica's segmented gather).

The step's rows come in segments, consecutive rows that share an adapter set (the generator keeps each
set's sequences together). One LoRAStack holds every adapter the step uses; a segment's scales say which of
them its rows meet (0: not in its set). Every layer's hooks then cost one shrink and one expand per module,
whatever the number of sets, and rows with no adapters are left untouched.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .adapter import LoRA
from .stack import LoRAStack


class LoRABatch:
    """A LoRAApply for one step: `segments` are (rows, {adapter: scale}) in the batch's flat row order."""

    def __init__(self, stack: LoRAStack, segments: Sequence[tuple[int, dict[LoRA, float]]]):
        index = {id(lora): j for j, lora in enumerate(stack.adapters)}
        rows: list[int] = []
        scales: list[tuple[float, ...]] = []
        for n, adapter_scales in segments:
            vec = [0.0] * len(stack.adapters)
            for lora, scale in adapter_scales.items():
                if id(lora) not in index:
                    raise ValueError(f"LoRA adapter {lora.name!r} is not in this step's stack")
                vec[index[id(lora)]] += float(scale)
            if rows and scales[-1] == tuple(vec):
                rows[-1] += n  # neighbours with the same set are one segment
            elif n:
                rows.append(n)
                scales.append(tuple(vec))
        self.stack = stack
        self.seg_rows = tuple(rows)
        adapter_scale = torch.tensor(scales, dtype=torch.float32).reshape(len(rows), len(stack.adapters))
        self._plans = stack.plans(adapter_scale, None if len(rows) == 1 else self.seg_rows)
        self.total_rows = sum(rows)

    def add(self, layer: int, kind: str, x: torch.Tensor, y: torch.Tensor) -> None:
        if x.shape[0] != self.total_rows:
            raise ValueError(f"this LoRABatch was planned for {self.total_rows} rows, the step has {x.shape[0]}")
        self.stack.apply(layer, kind, x, y, self._plans.__getitem__)

    def __repr__(self) -> str:
        return f"LoRABatch({len(self.stack.adapters)} adapters, segments {self.seg_rows})"


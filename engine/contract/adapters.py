"""LoRA adapters as plain names: the rule for (name, scale) pairs, and AdapterSnapshot.

A job, a chat's settings and the server all name adapters with scales; `check_lora_pairs` is the one rule
for such a list (names non-empty and distinct, scales finite numbers), so a chat setting the app accepts
is one the engine accepts too.

The generator's adapter registry lives on its worker thread; the app's panels and the server read it
from the event loop. They get the frozen AdapterSnapshot, published by the worker after every change, so
no reader ever iterates a dict the worker is changing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping


def check_lora_scale(scale: Any) -> float:
    """A LoRA scale as a float: any finite int or float (not a bool); ValueError otherwise."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"LoRA scales must be finite numbers, got {scale!r}")
    return float(scale)


def check_lora_pairs(pairs: Iterable[Any]) -> tuple[tuple[str, float], ...]:
    """(adapter name, scale) pairs, checked in order and returned with float scales: each item a 2-item tuple
    or list, each name a non-empty string named once, each scale finite (check_lora_scale). Raises
    ValueError naming the first problem."""
    out: list[tuple[str, float]] = []
    for item in pairs:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"LoRA adapters are (name, scale) pairs, got {item!r}")
        name, scale = item
        if not isinstance(name, str) or not name:
            raise ValueError(f"a LoRA adapter's name must be a non-empty string, got {name!r}")
        out.append((name, check_lora_scale(scale)))
    names = [name for name, _ in out]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"LoRA adapter {name!r} is named twice in loras (give it one scale)")
    return tuple(out)


@dataclass(frozen=True)
class AdapterSnapshot:
    """A generator's adapters at one moment.

    `folders`: every loaded adapter, name -> the folder it was read from (None: built in memory), including
    those being unloaded; `unloading`: names new jobs may no longer use (running jobs still hold them);
    `default`: the default set (name, scale), used by jobs that name no adapters.
    """

    folders: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))
    unloading: frozenset[str] = frozenset()
    default: tuple[tuple[str, float], ...] = ()

    @property
    def available(self) -> dict[str, str | None]:
        """name -> folder of the adapters a new job may name (loaded and not being unloaded)."""
        return {name: folder for name, folder in self.folders.items() if name not in self.unloading}

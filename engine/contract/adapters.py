"""AdapterSnapshot: which LoRA adapters a generator has, as plain names and folders.

The generator's adapter registry lives on its worker thread; the app's panels and the server read it
from the event loop. They get this frozen snapshot, published by the worker after every change, so no
reader ever iterates a dict the worker is changing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


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

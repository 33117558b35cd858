"""Models loaded beside the main one, for compare mode: each with its own generator and cache.

A chat names one of them in its settings (`ChatSettings.model`, the model's path) and its replies run on
that model's DynamicGeneratorAsync; chats naming none run on the main model. Each slot is a whole second
engine (weights, cache, worker thread), so the fit check runs for it against the memory left after the
models already loaded: the estimate guards them together, and a model that does not fit beside the
others is refused with the estimate's message before anything is allocated.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ModelNotLoaded(RuntimeError):
    """A chat names a model that is not loaded (any more); the message says what to do."""


@dataclass
class ModelSlot:
    """One model beside the main one."""

    path: str
    tokenizer: Any
    cache: Any
    generator: Any
    info: dict
    vision: Any = None  # the model's vision encoder (engine.load_vision), None: it reads text only

    @property
    def name(self) -> str:
        return self.info["name"]


def not_loaded(path: str) -> ModelNotLoaded:
    return ModelNotLoaded(f"model {Path(path).name} is not loaded: load it beside the main model (the compare "
                          f"bar's model list) or pick another model for this chat")

"""ServedModel: what the server serves right now: one generator, its tokenizer, a name, known adapters.

The app hands the server its own generator (and a new ServedModel after each model load), so API
requests batch with the chats; `python -m engine serve` builds one. The model ids a client may name are
the base model's and one per adapter (vLLM's convention: an adapter's id is its name, `parent` is the
base model); which adapter set a request runs with is decided here and nowhere else.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..generator.adapter_router import AdapterRouter
from .errors import ApiError


@dataclass
class ServedModel:
    generator: Any  # engine.DynamicGeneratorAsync
    tokenizer: Any  # engine.tokenizer.Tokenizer
    name: str
    router: AdapterRouter
    adapters: dict[str, Any] = field(default_factory=dict)  # model id -> adapter folder (Path) or LoRA
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def max_seq_len(self) -> int:
        return self.generator.generator.max_seq_len

    def resolve(self, model: Any) -> str | None:
        """The adapter a request's `model` names (None: the base model); 404 for an unknown id."""
        if model is None or model == self.name:
            return None
        if not isinstance(model, str):
            raise ApiError(400, f"model must be a string, got {type(model).__name__}", "model")
        if model in self.adapters:
            return model
        raise ApiError(404, f"The model `{model}` does not exist. Available: "
                            f"{', '.join([self.name, *self.adapters])}", "model", "model_not_found")

    def adapter_set(self, adapter: str | None) -> tuple:
        """The LoRA set a request for `adapter` runs with (the one function to change for per-job LoRA)."""
        return () if adapter is None else ((self.adapters[adapter], 1.0),)

    def model_entries(self) -> list[dict]:
        """/v1/models data: the base model, then each adapter with its base as parent (as vLLM lists them)."""
        base = {"id": self.name, "object": "model", "created": self.created, "owned_by": "pagedeck",
                "root": self.name, "parent": None, "max_model_len": self.max_seq_len}
        out = [base]
        for name, adapter in self.adapters.items():
            root = str(getattr(adapter, "path", adapter) or name)
            out.append({"id": name, "object": "model", "created": self.created, "owned_by": "pagedeck",
                        "root": root, "parent": self.name, "max_model_len": self.max_seq_len})
        return out


def adapter_name(path: str | Path) -> str:
    """The model id an adapter folder is served under by default: its folder name."""
    return Path(path).name

"""pagedeck's inference engine: a paged, continuously batched generator in the ExLlamaV2 dynamic style.

Public names follow ExLlamaV2's so its users feel at home. Nothing here imports Qt. The names load on
first use (PEP 562), so `import engine.contract` (what the app shares with the engine) never loads torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {  # public name -> module that defines it
    "ChoiceFilter": ".filters", "Filter": ".filters", "GrammarFilter": ".filters",
    "JSONSchemaFilter": ".filters", "RegexFilter": ".filters",
    "DynamicGenerator": ".generator", "DynamicJob": ".job",
    "DynamicGeneratorAsync": ".async_api", "DynamicJobAsync": ".async_api",
    "LoRA": ".lora", "LoRASet": ".lora",
    "Model": ".model", "ModelConfig": ".config", "PagedCache": ".cache", "PageTable": ".pagetable",
    "SamplerSettings": ".contract", "Tokenizer": ".tokenizer",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs; import-linter ignores these (exclude_type_checking_imports)
    from .async_api import DynamicGeneratorAsync, DynamicJobAsync
    from .cache import PagedCache
    from .config import ModelConfig
    from .contract import SamplerSettings
    from .filters import ChoiceFilter, Filter, GrammarFilter, JSONSchemaFilter, RegexFilter
    from .generator import DynamicGenerator
    from .job import DynamicJob
    from .lora import LoRA, LoRASet
    from .model import Model
    from .pagetable import PageTable
    from .tokenizer import Tokenizer


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

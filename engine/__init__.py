"""pagedeck's inference engine: a paged, continuously batched generator in the ExLlamaV2 dynamic style.

Public names follow ExLlamaV2's so its users feel at home. Nothing here imports Qt. The names load on
first use (PEP 562), so `import engine.contract` (what the app shares with the engine) never loads torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {  # public name -> module that defines it
    "ModelTooLarge": ".model.catalog.memory", "check_fits": ".model.catalog.memory",
    "estimate_memory": ".model.catalog.memory", "estimate_download": ".model.catalog.memory",
    "find_models": ".model.catalog.discovery", "model_locations": ".model.catalog.discovery",
    "build_cpu_kernels": ".model.cpu_kernels", "cpu_kernels_built": ".model.cpu_kernels",
    "ChatFormat": ".model.chat_format", "chat_format_choices": ".model.chat_format",
    "check_chat_format": ".model.chat_format",
    "ChoiceFilter": ".generator.filters", "Filter": ".generator.filters", "GrammarFilter": ".generator.filters",
    "JSONSchemaFilter": ".generator.filters", "RegexFilter": ".generator.filters",
    "DynamicGenerator": ".generator.generator", "DynamicJob": ".generator.job",
    "MMEmbedding": ".generator.embeddings", "encode_with_embeddings": ".generator.embeddings",
    "image_prompt": ".generator.image_prompt", "image_token_count": ".generator.image_prompt",
    "load_vision": ".vision",
    "DynamicGeneratorAsync": ".generator.async_api", "DynamicJobAsync": ".generator.async_api",
    "LoRA": ".model.lora", "LoRASet": ".model.lora",
    "Model": ".model.model", "ModelConfig": ".model.config", "PagedCache": ".cache.paged_cache",
    "load_model_and_tokenizer": ".model.model_and_tokenizer",
    "PageTable": ".cache.pagetable", "SamplerSettings": ".contract", "Tokenizer": ".model.tokenizer",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs; import-linter checks these like any other import
    from .cache.paged_cache import PagedCache
    from .cache.pagetable import PageTable
    from .contract import SamplerSettings
    from .generator.async_api import DynamicGeneratorAsync, DynamicJobAsync
    from .generator.filters import ChoiceFilter, Filter, GrammarFilter, JSONSchemaFilter, RegexFilter
    from .generator.generator import DynamicGenerator
    from .generator.embeddings import MMEmbedding, encode_with_embeddings
    from .generator.image_prompt import image_prompt, image_token_count
    from .generator.job import DynamicJob
    from .model.chat_format import ChatFormat, chat_format_choices, check_chat_format
    from .model.config import ModelConfig
    from .model.cpu_kernels import build_cpu_kernels, cpu_kernels_built
    from .model.catalog.discovery import find_models, model_locations
    from .model.lora import LoRA, LoRASet
    from .model.catalog.memory import ModelTooLarge, check_fits, estimate_download, estimate_memory
    from .model.model import Model
    from .model.model_and_tokenizer import load_model_and_tokenizer
    from .model.tokenizer import Tokenizer
    from .vision import load_vision


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

"""pagedeck's inference engine: a paged, continuously batched generator in the ExLlamaV2 dynamic style.

Public names follow ExLlamaV2's so its users feel at home. Nothing here imports Qt.
"""
from .cache import PagedCache
from .config import ModelConfig
from .filters import ChoiceFilter, Filter, GrammarFilter, JSONSchemaFilter, RegexFilter
from .generator import DynamicGenerator
from .job import DynamicJob
from .lora import LoRA, LoRASet
from .model import Model
from .pagetable import PageTable
from .sampling import SamplerSettings
from .tokenizer import Tokenizer

__all__ = [
    "ChoiceFilter", "DynamicGenerator", "DynamicGeneratorAsync", "DynamicJob", "DynamicJobAsync", "Filter",
    "GrammarFilter", "JSONSchemaFilter", "LoRA", "LoRASet", "Model", "ModelConfig", "PagedCache", "PageTable", "RegexFilter",
    "SamplerSettings", "Tokenizer",
]


def __getattr__(name: str):
    # The async API is imported lazily so the sync engine loads without asyncio machinery.
    if name in ("DynamicGeneratorAsync", "DynamicJobAsync"):
        from . import async_api

        return getattr(async_api, name)
    raise AttributeError(name)

"""LoRA adapters: PEFT adapters read and validated (adapter: `LoRA`), applied on the fly after each fused
linear through per-step stacks (stack: `LoRAStack`, `LoRASet` for one set on every row), and each job's rows
through its own set in one forward (batch: `LoRABatch`). The package's names are importable from here.

May import: kernels (the shrink/expand products) only: adapters reach the model through the generator.
"""
from .adapter import MODULES, Geometry, LoRA, MissingAdapterFile, check_fits
from .batch import LoRABatch
from .stack import LoRAApply, LoRASet, LoRAStack, adapter_identity, adapter_list, combine, scale_list

__all__ = ["MODULES", "Geometry", "LoRA", "LoRAApply", "LoRABatch", "LoRASet", "LoRAStack", "MissingAdapterFile",
           "adapter_identity", "adapter_list", "check_fits", "combine", "scale_list"]

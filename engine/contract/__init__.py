"""What the engine and its users (app, CLI, benchmarks) share, importable without torch.

One owner per fact: sampler settings and their rules, the result and metrics dicts, page-state codes,
weight and KV formats, defaults, what a model or adapter folder is. `import engine.contract` loads neither torch nor numpy, so the app's
model layer (settings, store, dashboard) depends on these facts without loading the engine.
"""
from .adapters import AdapterSnapshot, check_lora_pairs, check_lora_scale
from .formats import (
    DEFAULT_CACHE_TOKENS, DEFAULT_PAGE_SIZE, KV_QUANT_FORMATS, WEIGHT_ALIASES, WEIGHT_FORMATS,
    WEIGHT_NAMES,
    check_page_size,
)
from .load_progress import LOAD_STAGES, LoadProgress, LoadProgressCallback, stage_summary
from .paths import (
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHT_FILES, check_model_path, demo_adapters_folder, find_adapters, is_adapter_dir,
    is_gguf, model_path_problem,
)
from .results import (
    CACHED, EOS_REASONS, FREE, METRICS_KEYS, STAGES, DeferredResult, EosReason, Metrics, PrefillResult, Result,
    Stage, StartedResult, StreamingResult,
)
from .settings import GREEDY_TEMPERATURE, InvalidSetting, SamplerSettings

__all__ = [
    "ADAPTER_CONFIG_FILE", "AdapterSnapshot", "ADAPTER_WEIGHT_FILES", "CACHED", "DEFAULT_CACHE_TOKENS", "DEFAULT_PAGE_SIZE", "EOS_REASONS", "FREE", "GREEDY_TEMPERATURE",
    "InvalidSetting", "LOAD_STAGES", "LoadProgress", "LoadProgressCallback", "stage_summary",
    "KV_QUANT_FORMATS", "METRICS_KEYS", "STAGES", "WEIGHT_ALIASES", "WEIGHT_FORMATS", "WEIGHT_NAMES", "DeferredResult", "EosReason", "Metrics",
    "PrefillResult", "Result", "SamplerSettings", "Stage", "StartedResult", "StreamingResult", "check_lora_pairs",
    "check_lora_scale", "check_model_path",
    "check_page_size", "demo_adapters_folder", "find_adapters", "is_adapter_dir", "is_gguf", "model_path_problem",
]

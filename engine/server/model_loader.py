"""ModelLoader: turn a model path into a ServedModel (weights, tokenizer, page pool, generator, vision encoder).

`python -m engine serve` loads its --model with it at start and the model pool (models_pool) loads every
other model with it just in time, so each model gets the same treatment: the command line's weight format,
cache size and prompt format, its own page pool and its own generator (worker thread), warmed up before
its first request. The slow parts (reading weights, allocating the cache) run off the event loop, so the
models already loaded keep serving while another loads. `charge_bytes` is what a model counts against the
pool's memory budget: the engine's own estimate (engine.model.catalog.memory) of its weights, cache and
activations, the shared runtime left out.
"""
from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from .served import ServedModel

PAGE_SIZE = 256


def model_id(model) -> str:
    """The id clients send for a model: its name, a GGUF's without the extension."""
    name = str(model.name)
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


@dataclass(frozen=True)
class ModelLoader:
    weights: str = "auto"
    cache_tokens: int = 32768
    chat_template: str = "auto"
    page_size: int = PAGE_SIZE

    async def load(self, path: str | Path | None, name: str | None = None) -> ServedModel:
        """The model at `path` (None: the embedded default) served as `name` (default: its file name)."""
        from ..cache.paged_cache import PagedCache
        from ..generator.async_api import DynamicGeneratorAsync
        from ..model.model_and_tokenizer import load_model_and_tokenizer

        def build():
            model, tokenizer = load_model_and_tokenizer(path, weights=self.weights)
            tokenizer.set_chat_format(self.chat_template)
            cache = PagedCache(model, max_tokens=self.cache_tokens, page_size=self.page_size)
            return model, tokenizer, DynamicGeneratorAsync(model=model, cache=cache, tokenizer=tokenizer)

        model, tokenizer, generator = await asyncio.to_thread(build)
        try:
            vision = await asyncio.to_thread(load_vision_of, path)  # None: a text-only model
            await generator.run_on_worker(lambda g: g.warmup())
            return ServedModel(generator, tokenizer, name or model_id(model), vision=vision)
        except BaseException:
            await generator.close()
            raise

    @staticmethod
    async def release(served: ServedModel) -> None:
        """Free what load() made (the pool's unload): its generator, and with it the weights and pages."""
        await served.generator.close()

    @property
    def device(self) -> str:
        """Where Model.load puts a model (and so what the estimates count): "cuda" when there is a GPU, else "cpu"."""
        from ..model.loader import default_device

        return str(default_device())

    def charge_bytes(self, path: str | Path | None) -> int:
        """The model's share of the memory budget: the engine's estimate of its weights (in this loader's
        format), its page pool (cache_tokens) and one prefill's activations; 0 when its headers say nothing."""
        from ..model.catalog.memory import estimate_memory

        try:
            est = estimate_memory(path, cache_tokens=self.cache_tokens, weights=self.weights, device=self.device)
        except (OSError, ValueError, KeyError):
            return 0
        return est.total_bytes - est.runtime_bytes


def load_vision_of(path) -> object | None:
    """The model's vision encoder (an HF VLM folder's vision tower, or an mmproj GGUF beside the model
    GGUF), or None: no model path (the embedded default) or a text-only model."""
    if not path:
        return None
    from ..vision import load_vision

    try:
        return load_vision(path)
    except Exception as exc:  # noqa: BLE001 - the language model still serves text
        print(f"the vision encoder did not load, serving text only: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None

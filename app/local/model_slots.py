"""Models loaded beside the main one, for compare mode: each with its own generator and cache.

A chat names one of them in its settings (`ChatSettings.model`, the model's path) and its replies run on
that model's DynamicGeneratorAsync; chats naming none run on the main model. Each slot is a whole second
engine (weights, cache, worker thread), so the fit check runs for it against the memory left after the
models already loaded: the estimate guards them together, and a model that does not fit beside the
others is refused with the estimate's message before anything is allocated. `ModelsBeside` is
EngineService's part that loads and closes them and finds the model a chat's settings name.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.store import ChatSettings
from app.local.model_build import LoadRequest

log = logging.getLogger(__name__)


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


class ModelsBeside:
    """EngineService's models beside the main one: loading and closing them, and which model (tokenizer,
    generator, vision encoder) a chat's settings name. The state (`beside`, `info`, `request`, the signals)
    is EngineService's."""

    def _beside_of(self, settings: ChatSettings | None) -> ModelSlot | None:
        want = settings.model if settings is not None else None
        return self.beside.get(want) if want is not None and (self.info is None or want != self.info["path"]) else None

    def _vision_of(self, settings: ChatSettings | None) -> Any:
        """The vision encoder of the chat's model (None: it reads text only, or it is not loaded)."""
        slot = self._beside_of(settings)
        return slot.vision if slot is not None else self.vision

    def models(self) -> list[tuple[str | None, str]]:
        """(path, name) of every loaded model: the main one first (path None), then those beside it."""
        main = [(None, self.info["name"])] if self.info is not None else []
        return main + [(path, slot.name) for path, slot in self.beside.items()]

    async def load_beside(self, path: str | Path, cache_tokens: int | None = None) -> bool:
        """Load a second (third...) model with its own generator and cache; False (and load_failed) when it
        cannot load or does not fit in the memory the loaded models leave."""
        path = str(path)
        if self.generator is None or self.info is None:
            self.load_failed.emit("load a main model before loading another beside it")
            return False
        if self.loading or self._loading_beside:
            self.load_failed.emit("a model is already loading; wait for it to finish")
            return False
        if path == self.info["path"] or path in self.beside:
            self.load_failed.emit(f"{Path(path).name} is already loaded")
            return False
        self._loading_beside = True
        try:
            req = LoadRequest.from_dict({"path": path, "cache_tokens": cache_tokens or self.request["cache_tokens"]})
            model, tokenizer, cache, _, vision = await asyncio.to_thread(self._build, req, lambda _f: None)
            import engine

            generator = engine.DynamicGeneratorAsync(model=model, cache=cache, tokenizer=tokenizer)
        except Exception as exc:  # noqa: BLE001 - the models already loaded keep serving
            log.warning("loading a model beside %s failed: %s", self.info["name"], exc)
            self.load_failed.emit(f"Could not load {Path(path).name} beside {self.info['name']}: "
                                  f"{type(exc).__name__}: {exc}")
            return False
        finally:
            self._loading_beside = False
        info = {"name": model.name, "path": path, "params": model.num_parameters(), "cache_tokens": cache.max_tokens,
                "pages": cache.num_pages, "memory_bytes": model.memory_bytes() + cache.memory_bytes()}
        self.beside[path] = ModelSlot(path, tokenizer, cache, generator, info, vision)
        self.models_changed.emit(self.models())
        return True

    async def unload_beside(self, path: str) -> None:
        """Close a model loaded beside the main one (its running replies end as stopped)."""
        slot = self.beside.pop(path, None)
        if slot is None:
            return
        if self.metrics_model == path:
            self.metrics_model = None
        for identifier, job in list(self._jobs.items()):
            if job.generator is slot.generator:
                await self._forget_job(identifier).cancel()
        await slot.generator.close()
        self.models_changed.emit(self.models())

    def show_metrics(self, path: str | None) -> None:
        """The dashboard follows this model's generator (None: the main model)."""
        self.metrics_model = path if path in self.beside else None

    def _engine_of(self, settings: ChatSettings | None) -> tuple[Any, Any]:
        """(tokenizer, generator) of the model these settings name; ModelNotLoaded if it is not loaded."""
        want = settings.model if settings is not None else None
        if want is None or (self.info is not None and want == self.info["path"]):
            return self.tokenizer, self.generator
        slot = self.beside.get(want)
        if slot is None:
            raise not_loaded(want)
        return slot.tokenizer, slot.generator

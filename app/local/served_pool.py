"""The app's loaded models as an engine.server ModelPool, so the Server tab serves every one of them.

Each model the app holds (the main one and those beside it, app.local.model_slots) is one pool entry
whose ServedModel wraps the app's own generator: an API request naming a model runs as one more job on
the generator that model's chats use, so API requests and chats batch together. The pool loads nothing
itself (the Model tab and the compare bar do); it unloads: an idle timer (a request's ttl/keep_alive or
the tab's idle setting) or the tab's Unload button closes a model beside the main one through the app
(EngineService.unload_beside), so its chats see it go as when the compare bar closes it. The main model
is always pinned: the app holds it until another model replaces it. engine.server is imported only when
the app serves (the app loads no torch before a model).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


class MainModelHeld(ValueError):
    """The main model cannot be unloaded from the Server tab (the app's chats run on it)."""


class AppModelLoader:
    """The pool's loader over EngineService: it never loads (the app does), and releasing a model unloads
    it from the app."""

    def __init__(self, service):
        self.service = service

    async def load(self, path, name: str | None = None) -> Any:
        from engine.server.errors import ApiError

        raise ApiError(503, f"The model `{name}` is not loaded in the app any more: load it there (the Model tab, "
                            f"or beside the main model from the compare bar)", "model", "model_not_loaded")

    async def release(self, served) -> None:
        for path, slot in list(self.service.beside.items()):
            if slot.generator is served.generator:
                await self.service.unload_beside(path)
                return
        if served.generator is self.service.generator:
            raise MainModelHeld("the main model stays loaded: load another on the Model tab to replace it")

    @staticmethod
    def charge_bytes(path) -> int:
        return 0  # the pool is told each model's memory (set_loaded); it never loads one


def held_models(service, served: dict[int, Any]) -> list[tuple[Any, Path | None, int, bool]]:
    """What the pool should hold now: the main model (pinned), then each model beside it. `served` keeps one
    ServedModel per generator (by id) across calls, so an entry the pool holds is recognised."""
    from engine.server.model_loader import model_id

    out = []
    if service.generator is not None and service.info is not None:
        out.append((_served(served, service.generator, service.tokenizer, model_id(service.model),
                            service.vision), service.info.get("path"), service.info["memory_bytes"], True))
    for path, slot in service.beside.items():
        out.append((_served(served, slot.generator, slot.tokenizer, model_id(slot), slot.vision), path,
                    slot.info["memory_bytes"], False))
    live = {id(s.generator) for s, *_ in out}
    for key in [k for k in served if k not in live]:
        del served[key]
    return out


def _served(cache: dict[int, Any], generator, tokenizer, name: str, vision) -> Any:
    from engine.server import ServedModel

    s = cache.get(id(generator))
    if s is None or s.generator is not generator:
        s = cache[id(generator)] = ServedModel(generator, tokenizer, name, vision=vision)
    return s


def app_pool(service, default_ttl: float | None = None):
    """A pool over the app's models (no budget: the app's own fit check guards memory; nothing is discovered:
    a request names a model the app has loaded)."""
    from engine.server.models_pool import ModelPool

    return ModelPool(AppModelLoader(service), default_ttl=default_ttl)

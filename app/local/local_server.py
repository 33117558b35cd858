"""LocalServer: the app's models served over an OpenAI-compatible API (engine.server), from the app's loop.

API requests become jobs on the app's own generators (app.local.served_pool): a request naming a model
runs on the generator that model's chats use, so they batch together and the API job shows on the page
map under its request id. The served models follow the app: a reload serves the new main generator
(requests in flight during the swap get 503), a model loaded beside the main one is served at once, and
the adapters loaded into a generator are served as model ids. The models are an engine ModelPool, so
the Server tab can pin them, unload them, and set how long an idle one stays (a request's ttl /
keep_alive sets its own, as against `pagedeck serve`). The server runs on the app's event loop (aiohttp,
no thread, no second loop).
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.local.served_pool import MainModelHeld, app_pool, held_models


class LocalServer(QObject):
    """Owns the engine.server.OpenAIServer and the model pool serving an EngineService's models."""

    changed = Signal()  # started, stopped, a request count moved, a model was served, pinned or unloaded
    failed = Signal(str)

    def __init__(self, service, parent: QObject | None = None):
        super().__init__(parent)
        self.service = service
        self.server = None
        self.pool = None
        self.default_ttl: float | None = None  # idle seconds before a model beside the main one unloads
        self._served: dict = {}  # generator id -> its ServedModel (app.local.served_pool.held_models)
        service.loaded.connect(lambda _info: self._serve_current())
        service.models_changed.connect(lambda _models: self._serve_current())

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.running

    @property
    def url(self) -> str | None:
        return self.server.url if self.running else None

    async def start(self, host: str, port: int, api_key: str | None) -> bool:
        from engine.server import OpenAIServer

        if self.running:
            await self.stop()
        self.pool = app_pool(self.service, self.default_ttl)
        self.pool.busy = lambda entry: self.service.replies_on(entry.served.generator) > 0  # its chats hold it
        self.server = OpenAIServer(api_key=api_key or None, pool=self.pool)
        self.server.listeners.append(self.changed.emit)
        self.pool.listeners.append(self.changed.emit)
        self._serve_current()
        try:
            await self.server.start(host, port)
        except OSError as exc:
            self.server = None
            self.pool.detach()
            self.pool = None
            self.failed.emit(f"Could not listen on {host}:{port}: {exc.strerror or exc}")
            self.changed.emit()
            return False
        self.changed.emit()
        return True

    async def stop(self) -> None:
        """Stop listening; the app keeps every model (the pool forgets them, unloading none)."""
        server, self.server = self.server, None
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.detach()
        if server is not None:
            await server.stop()
        self.changed.emit()

    def _serve_current(self) -> None:
        """Serve whatever models the app has now (none: the server answers 503)."""
        if self.server is None:
            return
        self.pool.set_loaded(held_models(self.service, self._served))
        self.server.served = next((e.served for e in self.pool.loaded()
                                   if e.served.generator is self.service.generator), None)

    # ---- what the Server tab shows and changes --------------------------------------------------
    def models(self) -> list[dict]:
        """The served models, main one first: engine ModelPool.status() rows plus `main` and `chats`
        (the app's replies running on that model). Empty while not serving."""
        if self.pool is None:
            return []
        gens = {e.name: e.served.generator for e in self.pool.loaded()}
        out = []
        for row in self.pool.status():
            gen = gens.get(row["name"])
            out.append({**row, "main": gen is not None and gen is self.service.generator,
                        "chats": self.service.replies_on(gen) if gen is not None else 0})
        return out

    def model_of(self, generator) -> dict | None:
        """models()'s row of the model whose generator this is; None while not serving."""
        if self.pool is None:
            return None
        name = next((e.name for e in self.pool.loaded() if e.served.generator is generator), None)
        return next((r for r in self.models() if r["name"] == name), None)

    def set_pinned(self, name: str, pinned: bool) -> None:
        """Pin (never unloaded for idleness) or unpin a model beside the main one (the main one stays pinned)."""
        entry = self.pool.entry(name)
        if not pinned and entry.served is not None and entry.served.generator is self.service.generator:
            raise MainModelHeld("the main model stays pinned: the app's chats run on it")
        self.pool.set_pinned(name, pinned)

    async def unload(self, name: str) -> None:
        """Unload a model beside the main one (its chats' and requests' replies end as stopped)."""
        entry = self.pool.entry(name)
        if entry.served is not None and entry.served.generator is self.service.generator:
            raise MainModelHeld("the main model stays loaded: load another on the Model tab to replace it")
        await self.pool.unload(entry, "unloaded from the Server tab")

    def set_default_ttl(self, seconds: float | None) -> None:
        """How long an idle model beside the main one stays loaded (None: until unloaded by hand)."""
        self.default_ttl = seconds
        if self.pool is not None:
            self.pool.set_default_ttl(seconds)

"""ModelPool: every model the server can serve, loaded just in time, unloaded when idle or to make room.

`python -m engine serve` is a router over all the models on the machine, as Ollama, LM Studio and
llama-server's router mode are: the pool knows the --model one (pinned: loaded at start, never unloaded)
and every model engine.find_models finds (the app's Model tab list, plus --models-dir folders). A request
naming a model that is not loaded loads it (model_loader, off the event loop: the loaded models keep
serving), each model with its own page pool and generator, so requests to two models run at once.

Memory: each model counts its estimate (ModelLoader.charge_bytes) against a budget; before a load, the
least recently used unpinned idle model is unloaded until the new one fits (a busy one is waited for;
when only pinned models are left, the request gets a 503 saying why). Idle time: a model whose last
request ended `ttl` seconds ago is unloaded (engine.server.lifetime: --ttl, a request's ttl/keep_alive);
a model in use outside the pool (the app's chats, `busy`) counts as idle only once they end.
Unknown names and failed loads answer in OpenAI's error shape with the names that are available.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import ApiError
from .model_loader import ModelLoader
from .served import ServedModel

log = logging.getLogger(__name__)
RESCAN_GAP_S = 2.0  # an unknown name looks in the folders again at most this often (a client may send many)
BUSY_POLL_S = 0.5  # how often an idle-expired model that is busy elsewhere is looked at again


@dataclass(eq=False)
class PoolModel:
    """One model the pool can serve, loaded or not."""
    name: str
    path: Path | None
    charge: int  # bytes counted against the budget while loaded (or loading)
    pinned: bool = False
    served: ServedModel | None = None
    loading: asyncio.Future | None = None
    reserved: bool = False  # its load is under way: its charge already counts
    active: int = 0  # requests holding it (waiting for its load, or generating)
    last_used: float = 0.0  # time.monotonic() of the last request's start or end
    ttl: float | None = None  # idle seconds before unloading, once a request set it (ttl_set)
    ttl_set: bool = False
    timer: asyncio.Handle | None = None
    expires: float | None = None  # time.monotonic() at which the idle timer fires
    created: int = field(default_factory=lambda: int(time.time()))
    loads: int = 0
    unloads: int = 0
    requests_total: int = 0

    @property
    def status(self) -> str:
        return "loaded" if self.served is not None else "loading" if self.loading is not None else "unloaded"


def found_name(name: str) -> str:
    """The id of a found model: its source's name, a GGUF file's without the extension."""
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


class ModelPool:
    def __init__(self, loader: ModelLoader, *, budget: int | None = None, default_ttl: float | None = None,
                 discover: Callable[[], list] | None = None):
        self.loader = loader
        self.budget = budget  # bytes; None: no limit
        self.default_ttl = default_ttl  # idle seconds before an unpinned model unloads; None: never
        self._discover = discover  # () -> [engine.model.catalog.discovery.FoundModel]
        self.models: dict[str, PoolModel] = {}
        self._admit = asyncio.Lock()  # one admission (make room, reserve) at a time
        self._released = asyncio.Event()  # set (and replaced) whenever a request lets go of a model
        self._tasks: set[asyncio.Future] = set()
        self._closed = False
        self._scanned = float("-inf")  # time.monotonic() of the last refresh
        self.listeners: list[Callable[[], None]] = []  # called when a model loads or unloads
        # whether a model is in use outside the pool's requests (the app's chats): its idle time waits for them
        self.busy: Callable[[PoolModel], bool] = lambda entry: False

    # ---- what exists ----------------------------------------------------------------------------
    def add_loaded(self, served: ServedModel, path: str | Path | None, *, pinned: bool = True) -> PoolModel:
        """A model loaded elsewhere (serve's --model): listed first, never unloaded when pinned."""
        entry = PoolModel(served.name, Path(path) if path else None, self.loader.charge_bytes(path), pinned=pinned,
                          served=served, last_used=time.monotonic(), loads=1)
        self.models = {served.name: entry, **self.models}
        return entry

    def set_loaded(self, held: list[tuple[ServedModel, Path | None, int, bool]]) -> None:
        """Hold exactly these models, each loaded elsewhere (the app's): (served, path, charge, pinned). One
        whose generator the pool already holds keeps its entry (pin, ttl, idle timer); a new one starts idle;
        an entry whose generator is not among them is dropped (whoever loaded it has closed it)."""
        by_generator = {id(e.served.generator): e for e in self.models.values() if e.served is not None}
        fresh: dict[str, PoolModel] = {}
        for served, path, charge, pinned in held:
            e = by_generator.pop(id(served.generator), None)
            if e is None:
                e = PoolModel(served.name, Path(path) if path else None, charge, pinned=pinned, served=served,
                              last_used=time.monotonic(), loads=1)
                if e.name in fresh:  # two files with one model name: the later one is told apart by a suffix
                    e.name = served.name = f"{served.name}-{len(fresh) + 1}"
                fresh[e.name] = e
                self._start_timer(e)
            else:
                e.charge = charge
                fresh[e.name] = e
        for gone in by_generator.values():
            self._stop_timer(gone)
        if list(fresh) != list(self.models) or by_generator:
            self.models = fresh
            self._changed()

    def detach(self) -> None:
        """Stop every idle timer and forget the models, unloading none: they belong to whoever loaded them
        (the app keeps its models when it stops serving them)."""
        for e in self.models.values():
            self._stop_timer(e)
        self.models = {}

    async def refresh(self) -> None:
        """Read the model folders again (off the loop): new files are added, vanished unloaded ones dropped."""
        if self._discover is None:
            return
        self._scanned = time.monotonic()
        found = await asyncio.to_thread(self._discover)
        known = {self._key(e.path): e for e in self.models.values() if e.served is not None or e.loading
                 or e.pinned}
        fresh: dict[str, PoolModel] = {e.name: e for e in known.values()}
        for f in found:
            if not f.supported or self._key(f.path) in known:
                continue
            name = found_name(f.name)
            if name in fresh:  # two sources use one name: the first found keeps it
                continue
            old = self.models.get(name)
            if old is not None and self._key(old.path) == self._key(f.path):
                fresh[name] = old
                continue
            est = f.estimate
            charge = est.total_bytes - est.runtime_bytes if est is not None else self.loader.charge_bytes(f.path)
            fresh[name] = PoolModel(name, Path(f.path), charge)
        order = [n for n in self.models if n in fresh] + [n for n in fresh if n not in self.models]
        self.models = {n: fresh[n] for n in order}

    @staticmethod
    def _key(path: Path | None) -> Path | None:
        return None if path is None else Path(path).resolve()

    def available(self) -> list[str]:
        """Every id a request may name: each model, then the adapters of the loaded ones."""
        names = list(self.models)
        for e in self.models.values():
            if e.served is not None:
                names += [a for a in e.served.adapters if a not in names]
        return names

    def used_bytes(self) -> int:
        return sum(e.charge for e in self.models.values() if e.served is not None or e.reserved)

    def model_entries(self) -> list[dict]:
        """/v1/models data: each loaded model as ServedModel lists it (adapters after their base), then the
        unloaded ones; every entry says whether it is loaded and what it costs in memory."""
        out = []
        for e in self.models.values():
            extra = {"loaded": e.served is not None, "status": e.status, "memory_bytes": e.charge,
                     "pinned": e.pinned}
            if e.served is not None:
                out += [{**m, **extra} for m in e.served.model_entries()]
            else:
                out.append({"id": e.name, "object": "model", "created": e.created, "owned_by": "pagedeck",
                            "root": str(e.path), "parent": None, **extra})
        return out

    def _not_found(self, name: Any) -> ApiError:
        return ApiError(404, f"The model `{name}` does not exist. Available: {', '.join(self.available())}",
                        "model", "model_not_found")

    async def find(self, name: Any) -> PoolModel:
        """The model a request's `model` names (None: the pinned one; an adapter: its base); 404 if unknown,
        after looking in the folders again (a model downloaded since the last look is found)."""
        if name is None:
            pinned = next((e for e in self.models.values() if e.pinned), None)
            if pinned is not None:
                return pinned
            raise ApiError(400, f"name a model; available: {', '.join(self.available())}", "model")
        if not isinstance(name, str):
            raise ApiError(400, f"model must be a string, got {type(name).__name__}", "model")
        for attempt in range(2):
            if name in self.models:
                return self.models[name]
            for e in self.models.values():
                if e.served is not None and name in e.served.adapters:
                    return e
            if attempt == 0 and time.monotonic() - self._scanned >= RESCAN_GAP_S:
                await self.refresh()
        raise self._not_found(name)

    # ---- using a model --------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(self, name: Any, ttl: tuple[bool, float | None] = (False, None)):
        """The named model's ServedModel, loaded first if need be, held (never unloaded) until the block exits.
        `ttl`: a request's (given, seconds) of engine.server.lifetime.request_ttl."""
        entry = await self.find(name)
        entry.active += 1
        self._stop_timer(entry)
        if ttl[0] and not entry.pinned:
            entry.ttl, entry.ttl_set = ttl[1], True
        try:
            served = await self._ensure_loaded(entry)
            entry.last_used = time.monotonic()
            entry.requests_total += 1
            yield served
        finally:
            entry.active -= 1
            entry.last_used = time.monotonic()
            self._released.set()
            self._released = asyncio.Event()
            if entry.active == 0:
                self._start_timer(entry)

    async def _ensure_loaded(self, entry: PoolModel) -> ServedModel:
        while entry.served is None:
            if entry.loading is None:
                entry.loading = asyncio.ensure_future(self._load(entry))
            await asyncio.shield(entry.loading)  # one load, however many requests wait for it
        return entry.served

    async def _load(self, entry: PoolModel) -> None:
        try:
            async with self._admit:
                await self._make_room(entry)
                entry.reserved = True
            log.info("loading model %s from %s", entry.name, entry.path)
            try:
                served = await self.loader.load(entry.path, entry.name)
            except ApiError:
                raise
            except Exception as exc:  # noqa: BLE001 - any load failure is the request's answer
                log.error("model %s failed to load: %s: %s", entry.name, type(exc).__name__, exc)
                raise ApiError(500, f"The model `{entry.name}` failed to load: {type(exc).__name__}: {exc}. "
                                    f"Available: {', '.join(self.available())}", "model", "model_load_failed") from None
            if self._closed:
                await self.loader.release(served)
                raise ApiError(503, "the server is stopping", code="model_not_loaded")
            entry.served = served
            entry.loads += 1
            entry.last_used = time.monotonic()
            if entry.active == 0:  # every request that asked for it has gone: it idles from now
                self._start_timer(entry)
            self._changed()
        finally:
            entry.reserved = False
            entry.loading = None

    async def _make_room(self, entry: PoolModel) -> None:
        """Unload least recently used idle unpinned models until `entry` fits the budget; wait for busy ones."""
        while self.budget is not None and self.used_bytes() + entry.charge > self.budget:
            victims = [e for e in self.models.values() if e.served is not None and not e.pinned and e is not entry]
            if not victims:
                held = ", ".join(f"{e.name} ({_mib(e.charge)})" for e in self.models.values()
                                 if e.served is not None or e.reserved) or "nothing"
                raise ApiError(503, f"The model `{entry.name}` needs ~{_mib(entry.charge)} but the memory budget is "
                                    f"{_mib(self.budget)} and pinned or loading models hold it: {held}. Available "
                                    f"without a load: {', '.join(e.name for e in victims) or 'the loaded models'}",
                               "model", "model_does_not_fit")
            idle = [e for e in victims if e.active == 0]
            if idle:
                await self.unload(min(idle, key=lambda e: e.last_used), "evicted")
            else:
                await self._released.wait()

    async def unload(self, entry: PoolModel, why: str = "unloaded") -> None:
        """Drop a model's generator and weights (its requests, if any, end with a 503)."""
        served, entry.served = entry.served, None
        self._stop_timer(entry)
        if served is None:
            return
        log.info("model %s %s", entry.name, why)
        entry.unloads += 1
        await self.loader.release(served)
        del served
        gc.collect()
        self._changed()

    # ---- idle timers ----------------------------------------------------------------------------
    def _start_timer(self, entry: PoolModel) -> None:
        ttl = entry.ttl if entry.ttl_set else self.default_ttl
        if entry.pinned or ttl is None or entry.served is None or self._closed:
            return
        entry.timer = asyncio.get_running_loop().call_later(ttl, self._expire, entry)
        entry.expires = time.monotonic() + ttl

    @staticmethod
    def _stop_timer(entry: PoolModel) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = entry.expires = None

    def _expire(self, entry: PoolModel) -> None:
        entry.timer = entry.expires = None
        if entry.active == 0 and entry.served is not None and not entry.pinned and self.busy(entry):
            self._idle_when_free(entry)
            return
        if entry.active == 0 and entry.served is not None and not entry.pinned:
            task = asyncio.ensure_future(self.unload(entry, "idle: unloaded after its ttl"))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _idle_when_free(self, entry: PoolModel) -> None:
        """Used elsewhere (the app's chats): look again shortly; its idle time counts from when it is free."""
        def again() -> None:
            entry.timer = None
            if entry.served is None or entry.pinned or entry.active:
                return
            if self.busy(entry):
                self._idle_when_free(entry)
            else:
                self._start_timer(entry)

        entry.timer = asyncio.get_running_loop().call_later(BUSY_POLL_S, again)

    # ---- what a user changes, and what they see ---------------------------------------------------
    def entry(self, name: str) -> PoolModel:
        """The model named `name`; KeyError naming the known ones."""
        try:
            return self.models[name]
        except KeyError:
            raise KeyError(f"no model {name!r} in the pool; known: {', '.join(self.models) or 'none'}") from None

    def set_pinned(self, name: str, pinned: bool) -> None:
        """Pin (never unloaded for idleness nor evicted) or unpin (its idle time counts from now)."""
        e = self.entry(name)
        if e.pinned == pinned:
            return
        e.pinned = pinned
        self._stop_timer(e)
        if not pinned and e.active == 0:
            self._start_timer(e)
        self._changed()

    def set_default_ttl(self, seconds: float | None) -> None:
        """The idle time (None: never) of every model no request set its own for; idle timers restart."""
        self.default_ttl = seconds
        for e in self.models.values():
            if not e.ttl_set and e.served is not None and e.active == 0:
                self._stop_timer(e)
                self._start_timer(e)
        self._changed()

    def ttl_of(self, entry: PoolModel) -> float | None:
        """Idle seconds before `entry` unloads (None: never: pinned, or no ttl)."""
        return None if entry.pinned else entry.ttl if entry.ttl_set else self.default_ttl

    @staticmethod
    def time_left(entry: PoolModel) -> float | None:
        """Seconds until its idle timer unloads it; None while no timer runs (busy, pinned, no ttl)."""
        return None if entry.expires is None else max(0.0, entry.expires - time.monotonic())

    def status(self) -> list[dict]:
        """One row per model, for a status view (the app's Server tab): what /v1/models says, plus requests,
        ttl and time left."""
        return [{"name": e.name, "status": e.status, "memory_bytes": e.charge, "pinned": e.pinned,
                 "requests_running": e.active, "requests_total": e.requests_total, "ttl": self.ttl_of(e),
                 "time_left": self.time_left(e) if e.served is not None else None}
                for e in self.models.values()]

    # ---- the rest -------------------------------------------------------------------------------
    def _changed(self) -> None:
        for fn in list(self.listeners):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a listener's bug must not fail a load
                log.exception("model pool listener failed")

    def loaded(self) -> list[PoolModel]:
        return [e for e in self.models.values() if e.served is not None]

    async def close(self) -> None:
        """Unload every unpinned model (the pinned ones belong to whoever loaded them)."""
        self._closed = True
        for e in self.models.values():
            self._stop_timer(e)
        for task in [e.loading for e in self.models.values() if e.loading is not None] + list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for e in self.loaded():
            if not e.pinned:
                await self.unload(e, "unloaded: the server is stopping")


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MiB"

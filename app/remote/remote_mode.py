"""Remote mode: while connected to a server, new chat replies stream from it, the dashboard follows its
/metrics and the LoRA dock shows its adapters; disconnecting returns everything to the local model.

It changes only what its RemoteHandles give it: the chats' BackendSwitch (so switching is one assignment
and replies already running finish where they started), which LoRA panel the dock shows, the dashboard's
metrics source and status-bar messages. Its two widgets (the "Remote server" box and the server's LoRA
panel) are placed by whoever builds the window; `changed` says when the chats' backend changed.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.core.backend import Backend, BackendSwitch
from app.core.remote_backend import RemoteBackend
from app.core.remote_client import RemoteClient, RemoteError
from app.core.remote_metrics import parse_samples, served_models, snapshot_from_metrics
from app.core.tasks import spawn
from app.panels.dashboard_feed import DashboardFeed
from app.remote.remote_panel import RemoteLoraPanel, RemoteServerBox

log = logging.getLogger(__name__)

POLL_MS = 500


class RemoteMetricsPoller(QObject):
    """Polls a server's /metrics (and a pagedeck server's page map) into dashboard snapshots. A server with
    several models gets one model's snapshot at a time (`choose`, the first by default); `models` says
    which it reports, as the dashboard's picker lists them."""

    metrics = Signal(object)
    models = Signal(object)  # [(model name, model name)] whenever the server's models change
    failed = Signal(str)

    def __init__(self, client: RemoteClient, interval_ms: int = POLL_MS, parent: QObject | None = None):
        super().__init__(parent)
        self.client = client
        self._task: asyncio.Task | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)
        self.last: dict | None = None
        self.error: str | None = None
        self.model: str | None = None  # the model followed (None: the server's first)
        self.served: list[str] = []

    def start(self) -> None:
        self._timer.start()
        self._tick()

    def stop(self) -> None:
        self._timer.stop()
        if self._task is not None:
            self._task.cancel()

    def _tick(self) -> None:
        if self._task is None or self._task.done():  # a slow server never piles up requests
            self._task = asyncio.ensure_future(self.poll())

    def choose(self, model: str | None) -> None:
        """Follow this model's samples from the next poll on."""
        self.model = model

    async def poll(self) -> dict | None:
        try:
            text = await self.client.metrics_text()
            served = served_models(parse_samples(text))
            if served != self.served:
                self.served = served
                self.models.emit([(m, m) for m in served])
            model = self.model if self.model in served else served[0] if served else None
            # the page map a pagedeck server answers is its first model's
            pages = (await self.client.pages() if "pagedeck:pages_total" in text and (not served or model == served[0])
                     else None)
            snap = snapshot_from_metrics(text, pages, model=model if len(served) > 1 else None)
        except (RemoteError, ValueError) as exc:
            self.error = f"metrics: {exc}"
            self.failed.emit(self.error)
            return None
        self.last, self.error = snap, None
        self.metrics.emit(snap)
        return snap


@dataclass(frozen=True)
class RemoteHandles:
    """What remote mode changes outside itself, and nothing more."""

    chats: BackendSwitch  # the backend the chats hold: pointed at the server, then back at `local`
    local: Backend  # the in-process generator's backend
    show_server_loras: Callable[[bool], None]  # the LoRA dock shows the server's adapters (True) or the local panel
    dashboard: DashboardFeed  # whose metrics the dashboard shows
    message: Callable[[str, int], None]  # a transient status-bar message (text, milliseconds)


class RemoteMode(QObject):
    changed = Signal(object)  # connection info dict, or None when back on the local model

    def __init__(self, handles: RemoteHandles, parent: QObject | None = None):
        super().__init__(parent)
        self.handles = handles
        self.backend: RemoteBackend | None = None
        self.poller: RemoteMetricsPoller | None = None
        self.box = RemoteServerBox()
        self.lora_panel = RemoteLoraPanel()
        self.box.connect_requested.connect(lambda url, key: spawn(self.connect(url, key), self.box.show_error))
        self.box.disconnect_requested.connect(lambda: spawn(self.disconnect(), self.box.show_error))
        p = self.lora_panel
        p.use_requested.connect(self.use_model)
        p.load_requested.connect(lambda name, path: spawn(self.load_adapter(name, path), p.show_error))
        p.unload_requested.connect(lambda name: spawn(self.unload_adapter(name), p.show_error))
        p.refresh_requested.connect(lambda: spawn(self.refresh(), p.show_error))

    @property
    def connected(self) -> bool:
        return self.backend is not None

    # ---- connection --------------------------------------------------------------------------------
    async def connect(self, url: str, key: str = "") -> bool:
        """Route new replies to the server at `url`; False (and a message in the box) if it can't be used."""
        try:
            backend = RemoteBackend(url, key or None)
        except ValueError as exc:
            self.box.show_error(str(exc))
            return False
        try:
            info = await backend.connect()
        except RemoteError as exc:
            await backend.close()
            self.box.show_error(f"Could not connect: {exc}")
            return False
        if self.backend is not None:
            await self._release()
        self.backend = backend
        self.handles.chats.use(backend)
        self.box.set_connected(info)
        self.lora_panel.set_models(backend.entries, backend.model)
        self.handles.show_server_loras(True)
        self._follow_remote_metrics(backend)
        self.changed.emit(info)
        return True

    async def disconnect(self) -> None:
        """Back to the local model (replies still streaming from the server finish there)."""
        if self.backend is None:
            return
        await self._release()
        self.handles.chats.use(self.handles.local)
        self.box.set_connected(None)
        self.handles.show_server_loras(False)
        self.changed.emit(None)

    async def _release(self) -> None:
        backend, self.backend = self.backend, None
        if self.poller is not None:
            self.poller.stop()
            await self.poller.client.close()
            self.handles.dashboard.follow_local()
            self.poller.deleteLater()  # its parent (this mode) would keep it, its timer and last task, per connection
            self.poller = None
        await backend.close()

    def _follow_remote_metrics(self, backend: RemoteBackend) -> None:
        self.poller = RemoteMetricsPoller(RemoteClient(backend.url, backend.client.api_key), parent=self)
        self.handles.dashboard.follow(self.poller.metrics, f"Dashboard · {backend.url}", models=self.poller.models,
                                      choose=self.poller.choose)
        self.poller.failed.connect(lambda msg: self.handles.message(msg, 5000))
        self.poller.start()

    # ---- adapters ----------------------------------------------------------------------------------
    def use_model(self, model_id: str) -> None:
        """New chat replies name `model_id` (the base model or one of the server's adapters)."""
        if self.backend is None:
            self.lora_panel.show_error("not connected to a server")
            return
        self.backend.model = model_id
        self.lora_panel.set_models(self.backend.entries, model_id)

    async def refresh(self) -> None:
        if self.backend is None:
            return
        await self.backend.refresh()
        self.lora_panel.set_models(self.backend.entries, self.backend.model)

    async def load_adapter(self, name: str, path: str) -> bool:
        if self.backend is None:
            self.lora_panel.show_error("not connected to a server")
            return False
        try:
            await self.backend.client.load_adapter(name, path)
            await self.refresh()
        except RemoteError as exc:
            self.lora_panel.show_error(str(exc))
            return False
        self.lora_panel.select(name)
        return True

    async def unload_adapter(self, name: str) -> bool:
        if self.backend is None:
            self.lora_panel.show_error("not connected to a server")
            return False
        try:
            await self.backend.client.unload_adapter(name)
            await self.refresh()
        except RemoteError as exc:
            self.lora_panel.show_error(str(exc))
            return False
        return True

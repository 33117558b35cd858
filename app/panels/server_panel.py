"""The Server panel: serve the app's own generator over an OpenAI-compatible API (engine.server).

API requests become jobs on the same generator as the chats, so they batch together and show on the
page map under their request id. The served model follows the app: a model reload serves the new
generator (requests in flight during the swap get 503), and the adapters loaded into it (the LoRA
panel's "loaded" column, or POST /v1/load_lora_adapter) are served as model ids. The server runs on the
app's own event loop (aiohttp, no thread, no second loop).
"""
from __future__ import annotations

import asyncio
import logging

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget,
)

from app.core.tasks import spawn

log = logging.getLogger(__name__)

DEFAULT_PORT = 8399


class LocalServer(QObject):
    """Owns the engine.server.OpenAIServer serving an EngineService's generator."""

    changed = Signal()  # started, stopped or a request count moved
    failed = Signal(str)

    def __init__(self, service, parent: QObject | None = None):
        super().__init__(parent)
        self.service = service
        self.server = None
        service.loaded.connect(lambda _info: self._serve_current())

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
        self.server = OpenAIServer(api_key=api_key or None)
        self.server.listeners.append(self.changed.emit)
        self._serve_current()
        try:
            await self.server.start(host, port)
        except OSError as exc:
            self.server = None
            self.failed.emit(f"Could not listen on {host}:{port}: {exc.strerror or exc}")
            self.changed.emit()
            return False
        self.changed.emit()
        return True

    async def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            await server.stop()
        self.changed.emit()

    def _serve_current(self) -> None:
        """Serve whatever generator the app has now (None -> the server answers 503)."""
        if self.server is None:
            return
        s = self.service
        if s.generator is None:
            self.server.served = None
            return
        from engine.server import ServedModel
        from engine.server.main import model_id

        self.server.served = ServedModel(s.generator, s.tokenizer, model_id(s.model), vision=getattr(s, "vision", None))


class ServerPanel(QWidget):
    """Start/stop, host, port, key and a live request count."""

    def __init__(self, server: LocalServer, parent: QWidget | None = None):
        super().__init__(parent)
        self.server = server
        self.host_edit = QLineEdit("127.0.0.1")
        self.host_edit.setToolTip("127.0.0.1 serves this machine only; 0.0.0.0 serves the network (set a key)")
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1, 65535)
        self.port_spin.setValue(DEFAULT_PORT)
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("none (no key required)")
        self.start_button = QPushButton("Start")
        self.start_button.clicked.connect(self.toggle)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #d0342c;")
        self.error_label.hide()
        form = QFormLayout()
        form.addRow("Host", self.host_edit)
        form.addRow("Port", self.port_spin)
        form.addRow("API key", self.key_edit)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.start_button)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(row)
        layout.addWidget(self.status_label)
        layout.addWidget(self.error_label)
        layout.addStretch(1)
        server.changed.connect(self.refresh)
        server.failed.connect(self.show_error)
        self._task: asyncio.Task | None = None
        self.refresh()

    def toggle(self) -> asyncio.Task:
        """Start with the fields' settings, or stop when running."""
        self.error_label.hide()
        if self.server.running:
            self._task = spawn(self.server.stop(), self.show_error)
        else:
            self._task = spawn(self.server.start(self.host_edit.text().strip() or "127.0.0.1",
                                                 self.port_spin.value(), self.key_edit.text().strip() or None),
                               self.show_error)
        return self._task

    def refresh(self) -> None:
        running = self.server.running
        for w in (self.host_edit, self.port_spin, self.key_edit):
            w.setEnabled(not running)
        self.start_button.setText("Stop" if running else "Start")
        if not running:
            self.status_label.setText("Not serving. Start serves this app's model over an OpenAI-compatible API.")
            return
        api = self.server.server
        key = " · key required" if api.api_key else ""
        self.status_label.setText(f"Serving {api.url}/v1{key}\n{api.requests_total} requests "
                                  f"({api.requests_running} running)")

    def show_error(self, message: str) -> None:
        self.error_label.setText(str(message))
        self.error_label.show()

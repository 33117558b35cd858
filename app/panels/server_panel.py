"""The Server panel: serve the app's models over an OpenAI-compatible API (app.local.local_server).

Start/stop, host, port and key, a live request count, and while serving a table of the served models:
each one's memory, the chats and API requests running on it, how long it stays loaded once idle and the
time left, whether it is pinned, and buttons to pin/unpin and unload it. The table follows the pool as
it changes (a model loaded beside the main one, unloaded, a request's ttl) and counts the time left down
once a second while an idle timer runs. The main model is always pinned and cannot be unloaded here.
"""
from __future__ import annotations

import asyncio
import logging

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QAbstractItemView, QFormLayout, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton, QSpinBox,
    QTableWidget, QVBoxLayout, QWidget,
)

from app.core.tasks import spawn

log = logging.getLogger(__name__)

DEFAULT_PORT = 8399


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def idle_text(row: dict) -> str:
    """How long the model stays loaded once idle, and on a line of its own the time left while it idles."""
    if row["pinned"]:
        return "pinned: stays loaded"
    if row["ttl"] is None:
        return "no idle unload"
    after = f"idle unload after {_duration(row['ttl'])}"
    return after if row["time_left"] is None else f"{after}\nunloads in {_duration(row['time_left'])}"


def model_text(row: dict) -> str:
    """A row's cell: the name, then memory and what runs on it, then its idle unload."""
    name = row["name"] + (" (main)" if row["main"] else "")
    return "\n".join((name, f"{_mib(row['memory_bytes'])} · {_count(row['chats'], 'chat')} · "
                                 f"{_count(row['requests_running'], 'request')}", idle_text(row)))


class ServerPanel(QWidget):
    """Start/stop, host, port, key, a live request count and the served models' table."""

    def __init__(self, server, parent: QWidget | None = None):
        """`server`: the window's app.local.local_server.LocalServer (panels never import the backends)."""
        super().__init__(parent)
        self.server = server
        self.host_edit = QLineEdit("127.0.0.1")
        self.host_edit.setAccessibleName("Host")
        self.host_edit.setToolTip("127.0.0.1 serves this machine only; 0.0.0.0 serves the network (set a key)")
        self.port_spin = QSpinBox()
        self.port_spin.setAccessibleName("Port")
        self.port_spin.setRange(1, 65535)
        self.port_spin.setValue(DEFAULT_PORT)
        self.key_edit = QLineEdit()
        self.key_edit.setAccessibleName("API key")
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("none (no key required)")
        self.ttl_spin = QSpinBox()
        self.ttl_spin.setAccessibleName("Unload idle models after, minutes")
        self.ttl_spin.setRange(0, 24 * 60)
        self.ttl_spin.setSuffix(" min")
        self.ttl_spin.setSpecialValueText("never")
        self.ttl_spin.setToolTip("A model beside the main one unloads after this long without chats or requests "
                                 "(never: until you unload it). A request's ttl or keep_alive sets its own.")
        self.ttl_spin.valueChanged.connect(self._ttl_changed)
        self.start_button = QPushButton("Start")
        self.start_button.setAccessibleName("Start serving")
        self.start_button.clicked.connect(self.toggle)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        # one column, one model a row: its lines over its buttons (the tab shares a narrow column with the dashboard)
        self.table = QTableWidget(0, 1)
        self.table.setAccessibleName("Served models")
        self.table.setHorizontalHeaderLabels(["Served models"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.setMinimumHeight(160)
        self.row_labels: list[QLabel] = []
        self.pin_buttons: dict[str, QPushButton] = {}
        self.unload_buttons: dict[str, QPushButton] = {}
        self._rows: tuple = ()  # (name, pinned, main) of the rows the buttons were made for
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #d0342c;")
        self.error_label.hide()
        form = QFormLayout()
        form.addRow("Host", self.host_edit)
        form.addRow("Port", self.port_spin)
        form.addRow("API key", self.key_edit)
        form.addRow("Idle unload", self.ttl_spin)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.start_button)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(row)
        layout.addWidget(self.status_label)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.error_label)
        layout.addStretch(0)  # while the table is hidden (not serving) the room left goes here, not between
        server.changed.connect(self.refresh)
        server.failed.connect(self.show_error)
        self._tick = QTimer(self)  # counts the time left down while an idle timer runs
        self._tick.setInterval(1000)
        self._tick.timeout.connect(self.refresh)
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

    def _ttl_changed(self, minutes: int) -> None:
        self.server.set_default_ttl(minutes * 60.0 if minutes else None)
        self.refresh()

    def refresh(self) -> None:
        running = self.server.running
        for w in (self.host_edit, self.port_spin, self.key_edit):
            w.setEnabled(not running)
        self.start_button.setText("Stop" if running else "Start")
        self.start_button.setAccessibleName("Stop serving" if running else "Start serving")
        self.table.setVisible(running)
        if not running:
            self._tick.stop()
            self._fill([])
            self.status_label.setText("Not serving. Start serves this app's models over an OpenAI-compatible API.")
            return
        api = self.server.server
        key = " · key required" if api.api_key else ""
        self.status_label.setText(f"Serving {api.url}/v1{key}\n{api.requests_total} requests "
                                  f"({api.requests_running} running)")
        rows = self.server.models()
        self._fill(rows)
        counting = any(r["time_left"] is not None for r in rows)
        if counting and not self._tick.isActive():
            self._tick.start()
        elif not counting:
            self._tick.stop()

    def _fill(self, rows: list[dict]) -> None:
        """Texts every refresh; the rows' widgets only when the models or their pins change (focus stays put)."""
        shape = tuple((r["name"], r["pinned"], r["main"]) for r in rows)
        if shape != self._rows:
            self._rows = shape
            self.table.setRowCount(len(rows))
            self.pin_buttons, self.unload_buttons, self.row_labels = {}, {}, []
            for i, r in enumerate(rows):
                self.table.setCellWidget(i, 0, self._row_widget(r))
        for i, r in enumerate(rows):
            label = self.row_labels[i]
            text = model_text(r)
            if label.text() != text:
                label.setText(text)
                self.table.resizeRowToContents(i)  # its lines and buttons

    def _row_widget(self, r: dict) -> QWidget:
        label = QLabel()
        label.setWordWrap(True)
        label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.row_labels.append(label)
        buttons = QHBoxLayout()
        buttons.addWidget(self._pin_button(r))
        buttons.addWidget(self._unload_button(r))
        buttons.addStretch(1)
        cell = QWidget()
        box = QVBoxLayout(cell)
        box.setContentsMargins(4, 4, 4, 4)
        box.addWidget(label)
        box.addLayout(buttons)
        return cell

    def _pin_button(self, r: dict) -> QPushButton:
        name = r["name"]
        b = QPushButton("Unpin" if r["pinned"] else "Pin")
        b.setAccessibleName(f"{'Unpin' if r['pinned'] else 'Pin'} {name}")
        if r["main"]:
            b.setEnabled(False)
            b.setToolTip("The main model stays pinned: the app's chats run on it")
        else:
            b.setToolTip("Pinned: never unloaded for idleness" if not r["pinned"] else "Let it unload when idle")
            b.clicked.connect(lambda _=False, n=name, p=not r["pinned"]: self.pin(n, p))
        self.pin_buttons[name] = b
        return b

    def _unload_button(self, r: dict) -> QPushButton:
        name = r["name"]
        b = QPushButton("Unload")
        b.setAccessibleName(f"Unload {name}")
        if r["main"]:
            b.setEnabled(False)
            b.setToolTip("The main model stays loaded: load another on the Model tab to replace it")
        else:
            b.setToolTip("Unload it from the app (its chats' replies stop)")
            b.clicked.connect(lambda _=False, n=name: self.unload(n))
        self.unload_buttons[name] = b
        return b

    def pin(self, name: str, pinned: bool) -> None:
        self.error_label.hide()
        try:
            self.server.set_pinned(name, pinned)
        except (KeyError, ValueError) as exc:  # gone meanwhile, or the main model (served_pool.MainModelHeld)
            self.show_error(exc.args[0])

    def unload(self, name: str) -> asyncio.Task:
        self.error_label.hide()

        async def unload() -> None:
            try:
                await self.server.unload(name)
            except (KeyError, ValueError) as exc:
                self.show_error(exc.args[0])

        self._task = spawn(unload(), self.show_error)
        return self._task

    def show_error(self, message: str) -> None:
        self.error_label.setText(str(message))
        self.error_label.show()

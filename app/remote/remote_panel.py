"""Widgets for chatting through a remote server: the "Remote server" box of the Model panel and the LoRA
panel shown while connected (the server's adapters, runtime load/unload, which one the chats use).

They only emit requests and show state; app.remote.remote_mode does the work, so every failure (server down,
401, unknown adapter) arrives here as a message in the panel, never as an exception.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QListWidget, QListWidgetItem, QPushButton,
    QVBoxLayout, QWidget,
)


def _error_label() -> QLabel:
    label = QLabel()
    label.setWordWrap(True)
    label.setStyleSheet("color: #d0342c;")
    label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    label.hide()
    return label


class RemoteServerBox(QGroupBox):
    """Base URL + optional key; Connect routes new chat replies to that server, Disconnect back to local."""

    connect_requested = Signal(str, str)  # url, key ("" = none)
    disconnect_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Remote server", parent)
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://127.0.0.1:8000 (vLLM, SGLang, llama-server, pagedeck)")
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("optional API key")
        self.connect_button = QPushButton("Connect")
        self.disconnect_button = QPushButton("Use local model")
        self.connect_button.clicked.connect(self._connect)
        self.disconnect_button.clicked.connect(self.disconnect_requested)
        self.status_label = QLabel("Chats run on the local model.")
        self.status_label.setWordWrap(True)
        self.error_label = _error_label()
        form = QFormLayout()
        form.addRow("Base URL", self.url_edit)
        form.addRow("API key", self.key_edit)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.disconnect_button)
        row.addWidget(self.connect_button)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(row)
        layout.addWidget(self.status_label)
        layout.addWidget(self.error_label)
        self.set_connected(None)

    def _connect(self) -> None:
        if not self.url_edit.text().strip():
            self.show_error("Enter the server's base URL first.")
            return
        self.error_label.hide()
        self.connect_button.setEnabled(False)
        self.status_label.setText(f"Connecting to {self.url_edit.text().strip()}…")
        self.connect_requested.emit(self.url_edit.text().strip(), self.key_edit.text().strip())

    def set_connected(self, info: dict | None) -> None:
        """Show the server the chats use now (None: the local model)."""
        self.connect_button.setEnabled(True)
        self.disconnect_button.setEnabled(info is not None)
        if info is None:
            self.status_label.setText("Chats run on the local model.")
        else:
            adapters = f" · adapters: {', '.join(info['adapters'])}" if info.get("adapters") else ""
            self.status_label.setText(f"Chats stream from {info['url']} · model {info['model']}{adapters}")
            self.error_label.hide()

    def show_error(self, message: str) -> None:
        self.connect_button.setEnabled(True)
        self.error_label.setText(str(message))
        self.error_label.show()


class RemoteLoraPanel(QWidget):
    """The server's models (base + adapters, vLLM's /v1/models parents); load/unload at runtime."""

    use_requested = Signal(str)  # model id the chats should name
    load_requested = Signal(str, str)  # adapter name, folder on the server's machine
    unload_requested = Signal(str)
    refresh_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.active_label = QLabel("Chats use: –")
        self.active_label.setStyleSheet("font-weight: bold;")
        self.models = QListWidget()
        self.use_button = QPushButton("Use for chats")
        self.unload_button = QPushButton("Unload")
        self.refresh_button = QPushButton("Refresh")
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("adapter name, e.g. pirate")
        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText("adapter folder as the server sees it")
        self.browse_button = QPushButton("…")
        self.load_button = QPushButton("Load")
        self.error_label = _error_label()
        self.use_button.clicked.connect(lambda: self._with_selection(self.use_requested.emit))
        self.unload_button.clicked.connect(lambda: self._with_selection(self.unload_requested.emit, adapters_only=True))
        self.refresh_button.clicked.connect(self.refresh_requested)
        self.browse_button.clicked.connect(self._browse)
        self.load_button.clicked.connect(self._load)
        buttons = QHBoxLayout()
        for b in (self.refresh_button, self.unload_button, self.use_button):
            buttons.addWidget(b)
        path_row = QHBoxLayout()
        path_row.addWidget(self.path_edit, 1)
        path_row.addWidget(self.browse_button)
        form = QFormLayout()
        form.addRow("Name", self.name_edit)
        form.addRow("Folder", path_row)
        load_box = QGroupBox("Load an adapter on the server")  # a short title: the dock is narrow
        load_box.setToolTip("vLLM loads adapters at run time when started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
        box = QVBoxLayout(load_box)
        box.addLayout(form)
        box.addWidget(self.load_button, 0, Qt.AlignRight)
        layout = QVBoxLayout(self)
        layout.addWidget(self.active_label)
        layout.addWidget(self.models, 1)
        layout.addLayout(buttons)
        layout.addWidget(load_box)
        layout.addWidget(self.error_label)
        self._base: str | None = None

    def set_models(self, entries: list[dict], active: str | None) -> None:
        """List the server's models: the base first, then each adapter (marked with its parent)."""
        self.models.clear()
        self._base = next((str(e["id"]) for e in entries if not e.get("parent")), None)
        for e in entries:
            text = str(e["id"]) if not e.get("parent") else f"{e['id']}  (adapter of {e['parent']})"
            item = QListWidgetItem(text)
            item.setData(Qt.UserRole, str(e["id"]))
            item.setData(Qt.UserRole + 1, bool(e.get("parent")))
            self.models.addItem(item)
            if e["id"] == active:
                self.models.setCurrentItem(item)
        self.active_label.setText(f"Chats use: {active or '–'}")

    def select(self, model_id: str) -> None:
        for i in range(self.models.count()):
            if self.models.item(i).data(Qt.UserRole) == model_id:
                self.models.setCurrentRow(i)

    def _with_selection(self, emit, adapters_only: bool = False) -> None:
        item = self.models.currentItem()
        if item is None:
            self.show_error("Select a model in the list first.")
            return
        if adapters_only and not item.data(Qt.UserRole + 1):
            self.show_error("The base model can't be unloaded; select an adapter.")
            return
        self.error_label.hide()
        emit(item.data(Qt.UserRole))

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "LoRA adapter folder")
        if path:
            self.path_edit.setText(path)

    def _load(self) -> None:
        name, path = self.name_edit.text().strip(), self.path_edit.text().strip()
        if not name or not path:
            self.show_error("Give the adapter a name and its folder.")
            return
        self.error_label.hide()
        self.load_requested.emit(name, path)

    def show_error(self, message: str) -> None:
        self.error_label.setText(f"LoRA error: {message}")
        self.error_label.show()

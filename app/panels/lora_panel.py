"""The LoRA panel: find PEFT adapters on disk, load them into the generator, pick the default set.

Adapters are per chat (each chat picks loaded adapters in its settings) and per API request (an adapter's
name is a model id). The panel manages what is loaded (the "loaded" column: check to load, uncheck to
unload; an unload lets replies using it finish) and the default set for chats that name none: Apply
emits the checked (path, scale) list and the app swaps it at once when idle, otherwise once running
jobs finish (shown as pending). The panel never touches the engine. Adapters are only inspected here
(config + safetensors header) so a broken folder is flagged before anyone tries it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDoubleSpinBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QPushButton, QTableWidget,
    QTableWidgetItem, QVBoxLayout, QWidget,
)

from app.panels.wheel_guard import guard_wheel
from engine.contract import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHT_FILES, demo_adapters_folder, find_adapters

DEFAULT_LORA_DIR = demo_adapters_folder()


@dataclass(frozen=True)
class AdapterInfo:
    """What the panel knows about one adapter folder; `problem` is set when it can't be used."""

    name: str
    path: Path
    rank: int | None = None
    alpha: float | None = None
    targets: tuple[str, ...] = ()
    base_model: str | None = None
    problem: str | None = None

    def summary(self) -> str:
        if self.problem:
            return f"unusable: {self.problem}"
        parts = [f"r={self.rank}" if self.rank is not None else "r=?"]
        if self.alpha is not None:
            parts.append(f"alpha={self.alpha:g}")
        if self.targets:
            parts.append("/".join(self.targets))
        if self.base_model:
            parts.append(f"base {self.base_model}")
        return ", ".join(parts)


def inspect_adapter(path: Path) -> AdapterInfo:
    """Read an adapter's config (and safetensors header) without loading weights; never raises."""
    path = Path(path)
    name = path.name
    try:
        config = json.loads((path / ADAPTER_CONFIG_FILE).read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError(f"{ADAPTER_CONFIG_FILE} is not a JSON object")
    except (OSError, ValueError) as exc:
        return AdapterInfo(name, path, problem=f"bad {ADAPTER_CONFIG_FILE} ({exc})")
    targets = config.get("target_modules") or ()
    if isinstance(targets, str):
        targets = (targets,)
    info = dict(rank=config.get("r"), alpha=config.get("lora_alpha"),
                targets=tuple(str(t) for t in targets), base_model=config.get("base_model_name_or_path"))
    if not any((path / f).is_file() for f in ADAPTER_WEIGHT_FILES):
        return AdapterInfo(name, path, problem=f"no adapter weights ({' or '.join(ADAPTER_WEIGHT_FILES)})", **info)
    weights = path / ADAPTER_WEIGHT_FILES[0]
    if weights.is_file():
        try:
            from safetensors import safe_open

            with safe_open(str(weights), framework="numpy") as f:
                if not list(f.keys()):
                    raise ValueError("no tensors")
        except Exception as exc:  # the library raises several types for a corrupt header
            return AdapterInfo(name, path, problem=f"unreadable {weights.name} ({exc})", **info)
    return AdapterInfo(name, path, **info)


def scan_folder(folder: Path) -> list[AdapterInfo]:
    """Adapters in `folder` (the engine's rule, engine.contract.find_adapters), each inspected."""
    return [inspect_adapter(p) for p in find_adapters(folder)]


class LoraPanel(QWidget):
    """Lists adapters from resources/loras/ and user folders; Apply emits [(adapter_path, scale), ...]."""

    apply_requested = Signal(object)
    load_requested = Signal(str)  # adapter folder
    unload_requested = Signal(str)  # adapter name

    COL_NAME, COL_SCALE, COL_LOADED, COL_INFO = range(4)

    def __init__(self, parent: QWidget | None = None, lora_dir: str | Path | None = DEFAULT_LORA_DIR) -> None:
        super().__init__(parent)
        self._folders: list[Path] = []
        self._adapters: list[AdapterInfo] = []
        self._loaded: list[str] = []
        self.active_label = QLabel("Default LoRA: none")
        self.active_label.setWordWrap(True)
        self.active_label.setStyleSheet("font-weight: bold;")
        self.pending_label = QLabel("swap pending: waiting for running jobs")
        self.pending_label.setStyleSheet("color: #b8860b;")
        self.pending_label.hide()
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #d0342c;")
        self.error_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.error_label.hide()
        self.loaded_label = QLabel("Loaded: none")
        self.loaded_label.setWordWrap(True)
        self.table = QTableWidget(0, 4)
        self.table.setAccessibleName("Adapters")
        self.table.setHorizontalHeaderLabels(["default", "scale", "loaded", "details"])
        self.table.itemChanged.connect(self._loaded_toggled)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(self.COL_INFO, QHeaderView.Stretch)
        self.table.setSelectionMode(QTableWidget.NoSelection)
        self.empty_label = QLabel("No adapters found. Add a folder with PEFT adapters "
                                  "(adapter_config.json + adapter_model.safetensors).")
        self.empty_label.setWordWrap(True)
        self.add_button = QPushButton("Add folder…")
        self.clear_button = QPushButton("None")
        self.clear_button.setToolTip("Uncheck all adapters (Apply then makes the base model the default)")
        self.apply_button = QPushButton("Apply default")
        self.apply_button.setToolTip("Chats that pick no adapters in their settings use the checked set")
        self.apply_button.setDefault(True)
        self.add_button.clicked.connect(self._choose_folder)
        self.clear_button.clicked.connect(self.clear_selection)
        self.apply_button.clicked.connect(self.apply)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_button)
        buttons.addStretch(1)
        buttons.addWidget(self.clear_button)
        buttons.addWidget(self.apply_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.active_label)
        layout.addWidget(self.loaded_label)
        layout.addWidget(self.pending_label)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.empty_label)
        layout.addWidget(self.error_label)
        layout.addLayout(buttons)
        if lora_dir is not None and Path(lora_dir).is_dir():
            self.add_folder(lora_dir)
        self._refresh_empty()

    # ----------------------------------------------------------------------------------- folders
    def folders(self) -> list[str]:
        """Folders scanned so far (for the app to remember between sessions)."""
        return [str(f) for f in self._folders]

    def adapters(self) -> list[AdapterInfo]:
        return list(self._adapters)

    def add_folder(self, path: str | Path) -> int:
        """Scan `path` (an adapter folder or a folder of them); returns how many new adapters it added."""
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"LoRA folder does not exist or is not a directory: {folder}")
        folder = folder.resolve()
        if folder not in self._folders:
            self._folders.append(folder)
        known = {a.path.resolve() for a in self._adapters}
        added = 0
        for info in scan_folder(folder):
            if info.path.resolve() not in known:
                self._add_row(info)
                added += 1
        self._refresh_empty()
        return added

    def _choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Folder with LoRA adapters")
        if not path:
            return
        try:
            if self.add_folder(path) == 0:
                self.show_error(f"No new adapters in {path} (looked for folders with adapter_config.json).")
            else:
                self.error_label.hide()
        except OSError as exc:
            self.show_error(str(exc))

    def _add_row(self, info: AdapterInfo) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        name = QTableWidgetItem(info.name)
        name.setToolTip(str(info.path))
        name.setFlags(Qt.ItemIsEnabled | Qt.ItemIsUserCheckable if not info.problem else Qt.NoItemFlags)
        name.setCheckState(Qt.Unchecked)
        self.table.setItem(row, self.COL_NAME, name)
        scale = QDoubleSpinBox()
        scale.setAccessibleName(f"Scale of {info.name}")
        scale.setRange(-4.0, 4.0)
        scale.setSingleStep(0.05)
        scale.setDecimals(2)
        scale.setValue(1.0)
        scale.setEnabled(info.problem is None)
        self.table.setCellWidget(row, self.COL_SCALE, scale)
        guard_wheel(scale)  # the table scrolls under the pointer, not the scale
        loaded = QTableWidgetItem()
        loaded.setFlags(Qt.ItemIsEnabled | Qt.ItemIsUserCheckable if not info.problem else Qt.NoItemFlags)
        loaded.setCheckState(Qt.Checked if info.name in self._loaded else Qt.Unchecked)
        loaded.setToolTip("loaded into the generator: chats and API requests can use it")
        self.table.blockSignals(True)
        self.table.setItem(row, self.COL_LOADED, loaded)
        self.table.blockSignals(False)
        details = QTableWidgetItem(info.summary())
        details.setFlags(Qt.ItemIsEnabled)
        details.setToolTip(info.summary())
        if info.problem:
            details.setForeground(Qt.red)
        self.table.setItem(row, self.COL_INFO, details)
        self.table.resizeColumnToContents(self.COL_NAME)
        self._adapters.append(info)

    def _refresh_empty(self) -> None:
        self.empty_label.setVisible(not self._adapters)

    # ----------------------------------------------------------------------------------- selection
    def set_selection(self, choice: dict[str, float]) -> None:
        """Check the adapters named (by folder name or path) with their scales; uncheck the rest."""
        for row, info in enumerate(self._adapters):
            scale = choice.get(info.name, choice.get(str(info.path)))
            checked = scale is not None and info.problem is None
            self.table.item(row, self.COL_NAME).setCheckState(Qt.Checked if checked else Qt.Unchecked)
            if checked:
                self.table.cellWidget(row, self.COL_SCALE).setValue(float(scale))

    def clear_selection(self) -> None:
        self.set_selection({})

    def selection(self) -> list[tuple[str, float]]:
        """The checked adapters as (adapter_path, scale), in list order."""
        chosen = []
        for row, info in enumerate(self._adapters):
            if self.table.item(row, self.COL_NAME).checkState() == Qt.Checked:
                chosen.append((str(info.path), float(self.table.cellWidget(row, self.COL_SCALE).value())))
        return chosen

    def apply(self) -> None:
        """Emit the chosen set; an empty list means "no LoRA"."""
        self.error_label.hide()
        self.apply_requested.emit(self.selection())

    # ----------------------------------------------------------------------------------- state shown
    def set_active(self, names: list[str]) -> None:
        """Show the default set (what chats that name no adapters run with)."""
        self.active_label.setText("Default LoRA: " + (", ".join(str(n) for n in names) if names else "none"))

    def set_loaded(self, names: list[str]) -> None:
        """Show which adapters the generator has loaded (by folder name) without emitting requests."""
        self._loaded = [str(n) for n in names]
        self.loaded_label.setText("Loaded: " + (", ".join(self._loaded) or "none"))
        self.table.blockSignals(True)
        for row, info in enumerate(self._adapters):
            item = self.table.item(row, self.COL_LOADED)
            if item is not None:
                item.setCheckState(Qt.Checked if info.name in self._loaded else Qt.Unchecked)
        self.table.blockSignals(False)

    def loaded(self) -> list[str]:
        return list(self._loaded)

    def _loaded_toggled(self, item: QTableWidgetItem) -> None:
        if item.column() != self.COL_LOADED:
            return
        info = self._adapters[item.row()]
        if item.checkState() == Qt.Checked and info.name not in self._loaded:
            self.error_label.hide()
            self.load_requested.emit(str(info.path))
        elif item.checkState() != Qt.Checked and info.name in self._loaded:
            self.error_label.hide()
            self.unload_requested.emit(info.name)

    def set_pending(self, pending: bool) -> None:
        """Show that a swap waits for running jobs (new requests are deferred meanwhile)."""
        self.pending_label.setVisible(bool(pending))

    def show_error(self, msg: object) -> None:
        """Show an error in the panel; never raises (it runs inside event-loop callbacks)."""
        try:
            text = str(msg)
        except Exception:  # a message whose __str__ fails still gets reported
            text = f"<unprintable {type(msg).__name__}>"
        self.error_label.setText(f"LoRA error: {text}")
        self.error_label.show()

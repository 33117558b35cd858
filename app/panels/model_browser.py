"""The models already on this computer (engine.find_models), listed for the model panel.

A view only: scanning runs on a worker thread (headers only, but a slow disk should not freeze the window),
rows show architecture, parameters, quantization, file size and whether the memory estimate fits for the
panel's current cache and format choices; models this engine cannot run are greyed with the reason. A
click puts the model's path in the panel (via `chosen`); the estimate of the selected model is shown
before anything is loaded.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QFileDialog, QHBoxLayout, QHeaderView, QLabel, QPushButton, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget,
)

from app.core.formatting import human_bytes, human_count

COLUMNS = ("Model", "Source", "Architecture", "Parameters", "Quant", "Size", "Fits")
ARCH = COLUMNS.index("Architecture")  # also says whether the model sees images (no room for a column of its own)
NARROW_HIDDEN = (1, 2, 3)  # source, architecture, parameters: in the model's tooltip, so the list fits a dock
_GREY = QColor("#8a8a8a")
_BAD = QColor("#d0342c")


class ModelBrowser(QWidget):
    """Lists found models; emits chosen(path) when one is picked."""

    chosen = Signal(str)
    _scanned = Signal(object, object)  # (found models, error) from the worker thread

    def __init__(self, folders_path: str | Path | None = None, finder: Callable | None = None,
                 parent: QWidget | None = None, autoscan: bool = True) -> None:
        super().__init__(parent)
        import engine

        self._finder = finder or engine.find_models
        self._folders_path = Path(folders_path) if folders_path else None
        self.added_folders: list[str] = self._read_folders()
        self.options = {"cache_tokens": 8192, "kv_quant": None, "weights": "auto"}
        self.found: list = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-scan")
        self.scanning = False

        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setRootIsDecorated(False)
        self.tree.setAlternatingRowColors(True)
        self.tree.setSortingEnabled(True)
        self.tree.currentItemChanged.connect(self._selected)
        self.tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setMinimumSectionSize(24)
        self.tree.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)  # the name takes the room left, elided
        for col in range(1, len(COLUMNS)):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
            self.tree.setColumnHidden(col, col in NARROW_HIDDEN)
        self.status = QLabel("Not scanned yet.")
        self.status.setWordWrap(True)
        self.estimate_label = QLabel()
        self.estimate_label.setWordWrap(True)
        self.estimate_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.scan_button = QPushButton("Rescan")
        self.scan_button.clicked.connect(self.scan)
        self.add_button = QPushButton("Add folder…")
        self.add_button.clicked.connect(self._choose_folder)
        buttons = QHBoxLayout()  # the status on a line of its own: beside the buttons, in a dock ~330 px wide,
        buttons.addStretch(1)  # it wrapped a word a line
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.scan_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.status)
        layout.addLayout(buttons)
        layout.addWidget(self.estimate_label)
        self._scanned.connect(self._show)
        if autoscan:
            self.scan()

    # ----------------------------------------------------------------------------------- scanning
    def scan(self) -> None:
        if self.scanning:
            return
        self.scanning = True
        self.scan_button.setEnabled(False)
        self.status.setText("Scanning…")
        folders = list(self.added_folders)
        options = dict(self.options)

        def work():
            try:
                self._scanned.emit(self._finder(folders, **options), None)
            except Exception as exc:  # a scan must never take the window down
                self._scanned.emit([], exc)

        self._pool.submit(work)

    def _show(self, found: list, error: object) -> None:
        self.scanning = False
        self.scan_button.setEnabled(True)
        self.found = list(found)
        self.tree.setSortingEnabled(False)
        self.tree.clear()
        for m in self.found:
            self.tree.addTopLevelItem(self._row(m))
        self.tree.setSortingEnabled(True)
        self.set_load_options(**self.options)  # the panel's choices may have changed during the scan
        usable = sum(m.supported for m in self.found)
        self.status.setText(f"Scan failed: {error}" if error else
                            f"{len(self.found)} models found, {usable} usable" if self.found else
                            "No models found besides the embedded default (Default loads it). Discover downloads "
                            "more; Add folder… looks where yours are.")

    def _row(self, m) -> QTreeWidgetItem:
        info = m.info
        fits = "?" if m.fits is None else ("yes" if m.fits else "no")
        arch = (info.arch or "?") + (" · images" if m.sees_images else "")
        item = QTreeWidgetItem([m.name, m.source, arch, human_count(info.params) if info.params else "",
                                info.quant, human_bytes(info.file_bytes), fits if m.supported else "—"])
        item.setData(0, Qt.UserRole, str(m.path))
        item.setToolTip(ARCH, f"Sees images: vision projector {m.mmproj}" if m.mmproj is not None else
                        "Sees images: a vision tower in its config" if m.sees_images else
                        "Text only: no vision projector (mmproj*.gguf) beside it")
        item.setToolTip(0, f"{m.path}\n{m.source} · {info.arch or '?'} · "
                           f"{info.parameter_summary() if info.params else '? parameters'}")
        if not m.supported:
            item.setFlags(item.flags() & ~Qt.ItemIsEnabled)
            for col in range(len(COLUMNS)):
                item.setForeground(col, _GREY)
                item.setToolTip(col, f"Not supported: {m.reason}")
        elif m.fits is False:
            item.setForeground(6, _BAD)
            item.setToolTip(6, m.estimate.message())
        return item

    # ----------------------------------------------------------------------------------- choices
    def set_load_options(self, cache_tokens: int, kv_quant: str | None, weights: str) -> None:
        """The panel's cache and format choices: the estimates (and fits column) follow them."""
        from engine import estimate_memory

        self.options = {"cache_tokens": int(cache_tokens), "kv_quant": kv_quant, "weights": weights}
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            m = self._model(item)
            if m is not None and m.info.config is not None:
                m.estimate = estimate_memory(m.info, **self.options)
                fits = "?" if m.fits is None else ("yes" if m.fits else "no")
                item.setText(6, fits if m.supported else "—")
                item.setForeground(6, _BAD if m.fits is False else self.palette().text().color())
        self._selected(self.tree.currentItem())

    def _model(self, item: QTreeWidgetItem | None):
        if item is None:
            return None
        path = item.data(0, Qt.UserRole)
        return next((m for m in self.found if str(m.path) == path), None)

    def _selected(self, item: QTreeWidgetItem | None, _previous=None) -> None:
        m = self._model(item)
        if m is None:
            self.estimate_label.clear()
            return
        if not m.supported:
            self.estimate_label.setText(f"Not supported: {m.reason}")
            return
        if m.estimate is not None:
            est = m.estimate
            self.estimate_label.setText((est.message() if est.fits is False else
                                         ("Fits: it " if est.fits else "Estimate: it ") + est.summary())
                                        + (" · Sees images." if m.sees_images else " · Text only."))
        self.chosen.emit(str(m.path))

    # ----------------------------------------------------------------------------------- folders
    def add_folder(self, folder: str) -> None:
        folder = os.fspath(Path(folder).expanduser())
        if folder not in self.added_folders:
            self.added_folders.append(folder)
            self._save_folders()
        self.scan()

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "A folder with models (.gguf files or HF folders)")
        if folder:
            self.add_folder(folder)

    def _read_folders(self) -> list[str]:
        if self._folders_path is None or not self._folders_path.is_file():
            return []
        try:
            data = json.loads(self._folders_path.read_text(encoding="utf-8"))
            return [f for f in data.get("folders", []) if isinstance(f, str)]
        except (OSError, ValueError, AttributeError):
            return []

    def _save_folders(self) -> None:
        if self._folders_path is None:
            return
        self._folders_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._folders_path.with_name(self._folders_path.name + ".tmp")
        tmp.write_text(json.dumps({"folders": self.added_folders}, indent=1), encoding="utf-8")
        os.replace(tmp, self._folders_path)

    def closeEvent(self, event) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        super().closeEvent(event)

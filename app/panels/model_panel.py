"""The model panel: pick a model (HF folder or .gguf), cache size, KV quantisation and speculation, Load.

Loading runs elsewhere (off the UI thread, in the app); the panel only emits the request, shows progress
and then shows what is loaded. A failed load leaves the previous model's description in place, because
the app keeps that model running.
"""
from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path
from typing import Mapping

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QListWidget,
    QListWidgetItem, QProgressBar, QPushButton, QSpinBox, QVBoxLayout, QWidget,
)

from app.core.formatting import human_bytes, human_count
from app.panels.load_stages import LoadStages
from engine.contract import DEFAULT_PAGE_SIZE, KV_QUANT_FORMATS, WEIGHT_FORMATS, model_path_problem

# The engine owns which formats exist; the panel only labels them (a format without a label fails here).
_WEIGHT_LABELS = {"auto": "auto (a GGUF's quantized blocks kept packed on CPU)",
                  "dense": "dense (exact, dequantized)", "packed": "packed (a GGUF's quantized blocks)",
                  "q8": "q8 (quantize at load)"}
KV_CHOICES = tuple(("none (model dtype)" if f is None else f.upper(), f) for f in KV_QUANT_FORMATS)
WEIGHT_CHOICES = tuple((_WEIGHT_LABELS[f], f) for f in WEIGHT_FORMATS)
LOADED_KEYS = ("name", "path", "params", "memory_bytes", "device", "dtype", "cache_tokens", "pages")


class RecentModels:
    """Most-recent-first list of model paths kept in a small JSON file."""

    def __init__(self, path: str | Path, limit: int = 10) -> None:
        self.path = Path(path)
        self.limit = limit
        self.problem: str | None = None
        self.items: list[str] = []
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                items = data.get("recent") if isinstance(data, dict) else None
                if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                    raise ValueError("expected {\"recent\": [paths]}")
                self.items = items[:limit]
            except (OSError, ValueError) as exc:
                self.problem = f"recent-models file {self.path} unreadable, starting empty ({exc})"

    def add(self, model_path: str) -> None:
        self.items = [model_path] + [i for i in self.items if i != model_path]
        del self.items[self.limit:]
        self.save()

    def save(self) -> None:
        """Write atomically so a crash never leaves half a file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"recent": self.items}, indent=1), encoding="utf-8")
        os.replace(tmp, self.path)


class ModelPanel(QWidget):
    """Choose and load a model; always shows what is loaded and how much memory it takes."""

    load_requested = Signal(object)

    def __init__(self, recent_path: str | Path, parent: QWidget | None = None, page_size: int = DEFAULT_PAGE_SIZE,
                 cache_tokens: int = 32768, max_recent: int = 10, browser: QWidget | None = None) -> None:
        super().__init__(parent)
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self.recent = RecentModels(recent_path, max_recent)
        self.loaded: dict | None = None
        self._loading = False

        self.loaded_label = QLabel("No model loaded yet.")
        self.loaded_label.setWordWrap(True)
        self.loaded_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        loaded_box = QGroupBox("Loaded")
        QVBoxLayout(loaded_box).addWidget(self.loaded_label)

        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText("embedded default model (SmolLM2-135M-Instruct)")
        self.folder_button = QPushButton("HF folder…")
        self.gguf_button = QPushButton(".gguf…")
        self.default_button = QPushButton("Default")
        self.folder_button.clicked.connect(self._choose_folder)
        self.gguf_button.clicked.connect(self._choose_gguf)
        self.default_button.clicked.connect(self.path_edit.clear)
        self.path_edit.textChanged.connect(lambda text: self.path_edit.setToolTip(text))  # a long path, elided
        source = QVBoxLayout()  # the path over its buttons: the panel fits a narrow dock
        source.addWidget(self.path_edit)
        pickers = QHBoxLayout()
        for b in (self.folder_button, self.gguf_button, self.default_button):
            pickers.addWidget(b)
        source.addLayout(pickers)
        self.recent_list = QListWidget()
        self.recent_list.setMaximumHeight(110)
        self.recent_list.itemClicked.connect(lambda item: self.path_edit.setText(item.text()))
        self.recent_list.itemDoubleClicked.connect(self._load_recent)

        self.cache_spin = QSpinBox()
        self.cache_spin.setRange(page_size, 1 << 24)
        self.cache_spin.setSingleStep(page_size * 16)
        self.cache_spin.setSuffix(" tokens")
        self.cache_spin.setValue(max(page_size, int(cache_tokens)))
        self.pages_label = QLabel()
        self.pages_label.setWordWrap(True)
        self.cache_spin.valueChanged.connect(self._update_pages)
        cache = QHBoxLayout()
        cache.addWidget(self.cache_spin)
        cache.addWidget(self.pages_label, 1)
        self.kv_combo = QComboBox()
        for text, value in KV_CHOICES:
            self.kv_combo.addItem(text, value)
        self.weights_combo = QComboBox()
        for text, value in WEIGHT_CHOICES:
            self.weights_combo.addItem(text, value)
        self.draft_edit = QLineEdit()
        self.draft_edit.setPlaceholderText("none (no draft model)")
        self.draft_button = QPushButton("…")
        self.draft_button.setToolTip("Pick a draft .gguf, or the config.json of a draft HF folder")
        self.draft_button.clicked.connect(self._choose_draft)
        draft = QHBoxLayout()
        draft.addWidget(self.draft_edit, 1)
        draft.addWidget(self.draft_button)
        self.ngram_check = QCheckBox("n-gram drafting")
        self.ngram_check.setToolTip("Draft tokens from the prompt's own n-grams (no draft model needed)")
        for combo in (self.kv_combo, self.weights_combo):  # long labels elide instead of widening the dock
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(12)
            combo.setToolTip(combo.currentText())
            combo.currentTextChanged.connect(combo.setToolTip)

        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)  # labels above their fields when narrow
        form.addRow("Model", source)
        self.browser = browser  # app.panels.model_browser.ModelBrowser: the models found on this computer
        if browser is not None:
            form.addRow("Found", browser)
        form.addRow("Recent", self.recent_list)
        form.addRow("Cache size", cache)
        form.addRow("KV cache", self.kv_combo)
        form.addRow("Weights", self.weights_combo)
        form.addRow("Draft model", draft)
        form.addRow("", self.ngram_check)
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.load_button.clicked.connect(self.request_load)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setFormat("loading… %p%")
        self.progress.hide()
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #d0342c;")
        self.error_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.error_label.hide()
        load_box = QGroupBox("Load a model")
        box = QVBoxLayout(load_box)
        box.addLayout(form)
        row = QHBoxLayout()
        row.addWidget(self.progress, 1)
        row.addWidget(self.load_button)
        box.addLayout(row)
        self.stages = LoadStages()  # each stage's seconds, kept after the load
        box.addWidget(self.stages)
        box.addWidget(self.error_label)

        layout = QVBoxLayout(self)
        layout.addWidget(loaded_box)
        layout.addWidget(load_box)
        layout.addStretch(1)
        self._update_pages(self.cache_spin.value())
        self._refresh_recent()
        if browser is not None:
            browser.chosen.connect(self.path_edit.setText)
            for changed in (self.cache_spin.valueChanged, self.kv_combo.currentIndexChanged,
                            self.weights_combo.currentIndexChanged):
                changed.connect(self._sync_browser)
            self._sync_browser()
        if self.recent.problem:
            self.show_error(self.recent.problem)

    # ----------------------------------------------------------------------------------- choosing
    def add_section(self, widget: QWidget) -> None:
        """Add a box below the load box (e.g. the remote server's), above the panel's trailing stretch."""
        layout = self.layout()
        layout.insertWidget(layout.count() - 1, widget)

    def _choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Hugging Face model folder")
        if path:
            self.path_edit.setText(path)

    def _choose_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "GGUF model", "", "GGUF models (*.gguf)")
        if path:
            self.path_edit.setText(path)

    def _choose_draft(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Draft model", "", "GGUF or HF config (*.gguf config.json)")
        if path:
            self.draft_edit.setText(str(Path(path).parent) if Path(path).name == "config.json" else path)

    def _load_recent(self, item: QListWidgetItem) -> None:
        self.path_edit.setText(item.text())
        self.request_load()

    def _refresh_recent(self) -> None:
        self.recent_list.clear()
        for path in self.recent.items:
            item = QListWidgetItem(path)
            if not Path(path).exists():
                item.setForeground(Qt.gray)
                item.setToolTip("missing on disk")
            self.recent_list.addItem(item)

    def _update_pages(self, tokens: int) -> None:
        pages = math.ceil(tokens / self.page_size)
        self.pages_label.setText(f"= {pages} pages of {self.page_size} tokens")

    def _sync_browser(self, *_args) -> None:
        req = self.request()
        self.browser.set_load_options(req["cache_tokens"], req["kv_quant"], req["weights"])

    # ----------------------------------------------------------------------------------- requests
    def request(self) -> dict:
        """The load request the current choices describe."""
        path = self.path_edit.text().strip() or None
        draft = self.draft_edit.text().strip() or None
        return {"path": path, "cache_tokens": int(self.cache_spin.value()), "kv_quant": self.kv_combo.currentData(),
                "weights": self.weights_combo.currentData(), "draft_model": draft, "use_ngram": self.ngram_check.isChecked()}

    def set_request(self, request: Mapping[str, object]) -> None:
        """Show these choices (a request() dict, e.g. the last session's); unknown values are left as they are."""
        path, draft = request.get("path"), request.get("draft_model")
        self.path_edit.setText(path if isinstance(path, str) else "")
        self.draft_edit.setText(draft if isinstance(draft, str) else "")
        tokens = request.get("cache_tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            self.cache_spin.setValue(tokens)
        for combo, key in ((self.kv_combo, "kv_quant"), (self.weights_combo, "weights")):
            for index in range(combo.count()) if key in request else ():
                if combo.itemData(index) == request[key]:
                    combo.setCurrentIndex(index)
        self.ngram_check.setChecked(request.get("use_ngram") is True)

    def cancel_loading(self) -> None:
        """The app decided not to load after all (the user said no): the Load button works again."""
        self._finish_loading()

    def request_load(self) -> None:
        """Check the paths, then emit load_requested; the Load button stays off until the app answers."""
        if self._loading:
            return
        req = self.request()
        for label, path in (("model", req["path"]), ("draft model", req["draft_model"])):
            problem = model_path_problem(path) if path else None
            if problem:
                self.show_error(f"{label}: {problem}")
                return
        self._loading = True
        self.error_label.hide()
        self.load_button.setEnabled(False)
        self.progress.setValue(0)
        self.progress.show()
        self.stages.reset()
        self.load_requested.emit(req)

    @property
    def loading(self) -> bool:
        return self._loading

    # ----------------------------------------------------------------------------------- state shown
    def show_stage(self, text: str) -> None:
        """A load's stage on the progress bar ("Compiling kernels…" moves as busy until progress comes)."""
        self.progress.setFormat(f"{text} %p%")
        self.progress.setRange(0, 0)  # busy until the first set_progress: a compile reports no fraction
        self.progress.show()

    def set_progress(self, fraction: float) -> None:
        """Drive the progress bar from a load-progress callback (0..1)."""
        value = float(fraction)
        if not math.isfinite(value) or not -1e-6 <= value <= 1 + 1e-6:
            raise ValueError(f"load progress must be a fraction in [0, 1], got {fraction!r}")
        self.progress.setRange(0, 1000)
        self.progress.show()
        self.progress.setValue(round(min(max(value, 0.0), 1.0) * 1000))

    def show_load_report(self, report) -> None:
        """A stage of the load started, advanced or ended (an engine.contract.LoadProgress)."""
        self.stages.show_report(report)

    def set_loaded(self, info: Mapping[str, object]) -> None:
        """Show the model now running (and remember it in the recent list)."""
        missing = [k for k in LOADED_KEYS if k not in info]
        if missing:
            raise ValueError(f"set_loaded info lacks keys: {', '.join(missing)}")
        self.loaded = dict(info)
        self.loaded_label.setText(
            f"<b>{html.escape(str(info['name']))}</b><br>{html.escape(str(info['path']))}<br>"
            f"{human_count(float(info['params']))} parameters · {human_bytes(float(info['memory_bytes']))} in memory"
            f"<br>{html.escape(str(info['device']))} · {html.escape(str(info['dtype']))} · cache {int(info['cache_tokens']):,} tokens "
            f"({info['pages']} pages)")
        self.loaded_label.setToolTip(str(info["path"]))
        self._finish_loading()
        self.error_label.hide()
        if info["path"]:
            self.recent.add(str(info["path"]))
            self._refresh_recent()

    def show_error(self, msg: object) -> None:
        """Show why a load failed; what is loaded stays as it was."""
        try:
            text = str(msg)
        except Exception:
            text = f"<unprintable {type(msg).__name__}>"
        self.error_label.setText(f"Load failed: {text}" if self._loading else text)
        self.error_label.show()
        self._finish_loading()

    def _finish_loading(self) -> None:
        self._loading = False
        self.load_button.setEnabled(True)
        self.progress.hide()

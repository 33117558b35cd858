"""BatchView: set up, run, pause, resume and export a batch run (app.core.batch_controller does the work).

Choose a .csv/.jsonl file, write a template with {column} fields and a system prompt, pick a sampler
preset, Start. The progress bar and the results table fill as rows finish (each is already in the
history database then). Pause cuts off the rows in flight; Resume, in this session or after a restart
(the view reopens the last unfinished run), runs the rows not stored yet. Export writes inputs and
outputs as CSV or JSONL.
"""
from __future__ import annotations

import bisect
from pathlib import Path
from typing import Mapping

from PySide6.QtWidgets import (
    QComboBox, QFileDialog, QFormLayout, QGridLayout, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QProgressBar, QPushButton,
    QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from app.core.backend import Backend
from app.core.batch_controller import BatchController
from app.core.batch_runs import BatchRuns
from app.core.presets import BUILTIN_PRESETS, DEFAULT_PRESET, apply_preset
from app.core.store import ChatSettings, Store
from app.core.tasks import spawn
from engine.batch.inputs import BatchRow, PromptTemplate

PREVIEW_CHARS = 80


class BatchView(QWidget):
    def __init__(self, store: Store, backend: Backend, presets: Mapping[str, Mapping] | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.runs = BatchRuns(store)
        self.controller = BatchController(self.runs, backend, self._row_done, self._state_changed)
        self.presets = dict(presets or BUILTIN_PRESETS)
        self.run_id: int | None = None
        self.task = None

        self.file = QLineEdit(placeholderText="inputs.csv or inputs.jsonl")
        browse = QPushButton("Choose…")
        browse.clicked.connect(self.choose_file)
        self.template = QLineEdit(placeholderText="Summarise: {text}")
        self.system = QLineEdit(placeholderText="You are a concise assistant.")
        self.preset = QComboBox()
        self.preset.addItems(list(self.presets))
        self.preset.setCurrentText(DEFAULT_PRESET)
        self.max_tokens = QSpinBox(minimum=1, maximum=32768, value=256)
        self.start_btn = QPushButton("Start")
        self.pause_btn = QPushButton("Pause")
        self.resume_btn = QPushButton("Resume")
        self.export_btn = QPushButton("Export…")
        self.start_btn.clicked.connect(self.start)
        self.pause_btn.clicked.connect(self.pause)
        self.resume_btn.clicked.connect(self.resume)
        self.export_btn.clicked.connect(self.choose_export)
        self.progress = QProgressBar()
        self.progress.setFormat("%v / %m rows")
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["#", "Input", "Output"])
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)  # both texts share the width: no sideways scroll
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        header.resizeSection(1, 260)
        self._indices: list[int] = []  # row index shown in each table row, kept in input order

        pick = QHBoxLayout()
        pick.addWidget(self.file, 1)
        pick.addWidget(browse)
        form = QFormLayout()
        form.addRow("Inputs", pick)
        form.addRow("Template", self.template)
        form.addRow("System prompt", self.system)
        form.addRow("Preset", self.preset)
        form.addRow("Max tokens", self.max_tokens)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)  # labels above fields in a narrow dock
        buttons = QGridLayout()  # two rows of two: the dock's width on a small screen holds them whole
        for i, b in enumerate((self.start_btn, self.pause_btn, self.resume_btn, self.export_btn)):
            buttons.addWidget(b, i // 2, i % 2)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.progress)
        layout.addWidget(self.message)
        layout.addWidget(self.table, 1)
        self._reopen()

    # --- commands ------------------------------------------------------------------------------

    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Batch inputs", "", "Inputs (*.csv *.jsonl)")
        if path:
            self.file.setText(path)

    def start(self) -> None:
        """A new run from the form (a bad file or a template naming a missing column is shown, not run)."""
        settings = apply_preset(ChatSettings(max_new_tokens=self.max_tokens.value()), self.presets[self.preset.currentText()])
        try:
            run = self.controller.prepare(self.file.text().strip(), self.template.text(), self.system.text(), settings)
        except ValueError as exc:
            self._say(str(exc))
            return
        self.run_id = run.id
        self.table.setRowCount(0)
        self._indices.clear()
        self.progress.setRange(0, run.total)
        self.progress.setValue(0)
        self._go()

    def pause(self) -> None:
        self.controller.pause()

    def resume(self) -> None:
        if self.run_id is not None and not self.controller.running:
            self._go()

    def choose_export(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export batch results", "results.csv", "CSV (*.csv);;JSONL (*.jsonl)")
        if path:
            self.export(path)

    def export(self, path: str | Path) -> int:
        if self.run_id is None:
            raise RuntimeError("no batch run to export")
        n = self.controller.export(self.run_id, path)
        self._say(f"Exported {n} rows to {Path(path).name}.")
        return n

    # --- state ---------------------------------------------------------------------------------

    def _go(self) -> None:
        self._say("")
        self.task = spawn(self.controller.run(self.run_id), self._say)
        self._buttons()

    def _reopen(self) -> None:
        """Show the last run (after a restart: its stored rows, and Resume if it is unfinished)."""
        run = self.runs.latest()
        if run is not None:
            self.run_id = run.id
            self.file.setText(run.input_path)
            self.template.setText(run.template)
            self.system.setText(run.system_prompt)
            self.max_tokens.setValue(run.settings.max_new_tokens)
            self.progress.setRange(0, run.total)
            results = self.runs.results(run.id)
            for values, result in results:
                self._add_row(result["index"], values, result)
            self.progress.setValue(len(results))
            if run.state == "paused":
                self._say(f"Paused at {len(results)} of {run.total} rows: Resume runs the rest.")
        self._buttons()

    def _row_done(self, run_id: int, row: BatchRow, result: dict) -> None:
        if run_id != self.run_id:
            return
        self._add_row(row.index, row.values, result)
        self.progress.setValue(self.progress.value() + 1)

    def _add_row(self, index: int, values: dict, result: dict) -> None:
        """One finished row, in input order: the template's fields of that row (the prompt in the tooltip)."""
        run = self.runs.run(self.run_id)
        template = PromptTemplate(run.template)
        shown = " · ".join(values.get(f, "") for f in template.fields)[:PREVIEW_CHARS]
        r = bisect.bisect(self._indices, index)
        self._indices.insert(r, index)
        self.table.insertRow(r)
        output = result.get("output") or ""
        if result.get("error"):
            output = f"error: {result['error']}"
        tips = ("", template.render(BatchRow(index, values)), output)
        for col, text in enumerate((str(index + 1), shown, output.strip())):
            item = QTableWidgetItem(text)
            item.setToolTip(tips[col])
            self.table.setItem(r, col, item)

    def _state_changed(self, run_id: int, state: str) -> None:
        if state == "paused":
            why = f" ({self.controller.stopped_by})" if self.controller.stopped_by else ""
            self._say(f"Paused at {self.progress.value()} of {self.progress.maximum()} rows{why}: Resume runs the rest.")
        elif state == "done":
            self._say(f"Done: {self.progress.maximum()} rows.")
        self._buttons()

    def _buttons(self) -> None:
        running = self.controller.running
        unfinished = self.run_id is not None and self.runs.run(self.run_id).state in ("paused", "new")
        self.start_btn.setEnabled(not running)
        self.pause_btn.setEnabled(running)
        self.resume_btn.setEnabled(not running and unfinished)
        self.export_btn.setEnabled(self.run_id is not None)

    def _say(self, text: str) -> None:
        self.message.setText(text)

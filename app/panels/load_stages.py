"""LoadStages: the Model tab's line of a load's stages (header, weights, tokenizer), as the engine reports them.

While a model loads it reads e.g. "header 0.02 s · weights 43 % · tokenizer…"; once every stage is done it
reads "header 0.02 s · weights 0.61 s · tokenizer 0.35 s" and stays so after the load, until the next load
starts. A stage that failed says so ("weights failed"). Reports arrive on the UI thread (EngineService posts
them), so the label is only ever touched there.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

from engine.contract import LOAD_STAGES, LoadProgress, stage_summary


class LoadStages(QLabel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.setAccessibleName("Load stages")
        self.reset()

    def reset(self) -> None:
        """A new load starts: forget the previous one's stages."""
        self.durations: dict[str, float] = {}
        self._running: dict[str, float] = {}  # stage -> fraction so far
        self._failed: set[str] = set()
        self.clear()
        self.hide()  # until the new load's first report (a load refused before reading shows none)

    def show_report(self, report: LoadProgress) -> None:
        if report.error is not None:
            self._failed.add(report.stage)
            self._running.pop(report.stage, None)
        elif report.done:
            self.durations[report.stage] = report.elapsed_s
            self._running.pop(report.stage, None)
        else:
            self._running[report.stage] = report.fraction
        self.setText(self.describe())
        self.show()

    def describe(self) -> str:
        if len(self.durations) == len(LOAD_STAGES):
            return stage_summary(self.durations)
        parts = []
        for stage in LOAD_STAGES:
            if stage in self.durations:
                parts.append(f"{stage} {self.durations[stage]:.2f} s")
            elif stage in self._failed:
                parts.append(f"{stage} failed")
            elif stage in self._running:
                fraction = self._running[stage]
                parts.append(f"{stage} {fraction:.0%}" if stage == "weights" else f"{stage}…")
        return " · ".join(parts)

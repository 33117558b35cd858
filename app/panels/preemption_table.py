"""Preemptions per chat: how often a chat's replies gave their cache pages back, resumed, and how many tokens
of K/V had to be computed again, from the snapshots' `job_preemptions` (engine metrics, by job serial).

A chat's row sums every reply of it (its versions of an "N replies" answer too); batch rows are summed per
run and API requests in one row. The snapshots keep a job's counters a while after it ended, so a reply
preempted just before it finished still counts; the table keeps them until `clear()` (another model or
source). Hidden while nothing was preempted.
"""
from __future__ import annotations

from typing import Any, Mapping

from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem

from app.core.chat_colours import CHAT_COLOURS

COLUMNS = ("Chat", "Preempted", "Resumed", "Recomputed tokens")


def chat_of(identifier: Any) -> Any:
    """The row a job counts in: its chat's id; ("batch", run) for batch rows; "api" for API requests."""
    if isinstance(identifier, tuple) and identifier:
        return ("batch", identifier[1]) if identifier[0] == "batch" and len(identifier) > 1 else identifier[0]
    if isinstance(identifier, str):
        return "api"
    return identifier


class PreemptionTable(QTableWidget):
    def __init__(self, parent=None):
        super().__init__(0, len(COLUMNS), parent)
        self.setHorizontalHeaderLabels(COLUMNS)
        self.setAccessibleName("Preemptions per chat")
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().hide()
        self.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.setMaximumHeight(120)
        self._jobs: dict[tuple, dict] = {}  # (serial, identifier) -> its last counters
        self._labels: dict = {}
        self._shown: list[tuple] | None = None
        self.hide()

    def set_labels(self, labels: Mapping[object, str]) -> None:
        self._labels = dict(labels)
        self._shown = None

    def clear_counts(self) -> None:
        self._jobs.clear()
        self._refresh()

    def push(self, job_preemptions: Mapping[int, Mapping] | None) -> None:
        """Fold one snapshot's job_preemptions in (None: the source has none, e.g. a remote server)."""
        for serial, c in (job_preemptions or {}).items():
            self._jobs[(serial, repr(c["identifier"]))] = dict(c)
        self._refresh()

    def per_chat(self) -> dict[Any, tuple[int, int, int]]:
        """chat (chat_of) -> (preemptions, resumes, recomputed tokens) summed over its replies."""
        out: dict[Any, list[int]] = {}
        for c in self._jobs.values():
            row = out.setdefault(chat_of(c["identifier"]), [0, 0, 0])
            row[0] += c["preemptions"]
            row[1] += c["resumes"]
            row[2] += c["recomputed_tokens"]
        return {k: tuple(v) for k, v in out.items()}

    def label(self, chat: Any) -> str:
        if chat == "api":
            return "API requests"
        if isinstance(chat, tuple):
            return f"Batch run {chat[1]}"
        title = self._labels.get(chat, self._labels.get(str(chat))) or CHAT_COLOURS.label(chat)
        return title or f"chat {chat}"

    def _refresh(self) -> None:
        rows = sorted(((self.label(k),) + v for k, v in self.per_chat().items()), key=lambda r: (-r[1], r[0]))
        if rows == self._shown:
            return
        self._shown = rows
        self.setRowCount(len(rows))
        for i, row in enumerate(rows):
            for j, value in enumerate(row):
                item = QTableWidgetItem(str(value))
                self.setItem(i, j, item)
        self.setVisible(bool(rows))

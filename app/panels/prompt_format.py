"""The Model tab's prompt-format box: which format the loaded model's chats are sent in, and the override.

The engine decides the format (engine.model.chat_format: the model's own template, else its family's,
else plain completion for a base model) and names its decision; this box shows that name and offers the
other choices: the automatic rule, the model's own template, each family's, plain completion, or a
custom Jinja file. A choice is emitted (`chosen`); the window applies it to the running model and
remembers it for that model, so the model loads with it next time.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QGroupBox, QLabel, QVBoxLayout, QWidget

import engine

CUSTOM = "\0custom"  # the combo entry that asks for a file


class PromptFormatBox(QGroupBox):
    chosen = Signal(str)  # a choice for engine's set_chat_format: "auto", "model", a family, "plain" or a file

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Prompt format", parent)
        self.current = QLabel("No model loaded.")
        self.current.setWordWrap(True)
        self.current.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.combo = QComboBox()
        for value, label in engine.chat_format_choices():
            self.combo.addItem(label, value)
        self.combo.addItem("custom Jinja file…", CUSTOM)
        # sized by a short text, not its longest choice: the Model tab must fit a small screen's dock
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(12)
        self.combo.setToolTip("How chats with this model are turned into its prompt; remembered for this model")
        self.combo.setEnabled(False)
        self.combo.activated.connect(self._activated)  # user picks only, never show_format's own changes
        self.problem = QLabel()
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("color: #d0342c;")
        self.problem.hide()
        layout = QVBoxLayout(self)
        layout.addWidget(self.current)
        layout.addWidget(self.combo)
        layout.addWidget(self.problem)
        self._choice = "auto"

    def show_format(self, info: dict | None) -> None:
        """Show the running model's format (EngineService.chat_format_info), or none loaded."""
        if info is None:
            self.current.setText("No model loaded.")
            self.combo.setEnabled(False)
            return
        text = f"Chats are sent as: <b>{info['label']}</b>"
        if info["kind"] == "plain":
            text += "<br>The chat goes to the model as plain text to continue, without chat turns."
        self.current.setText(text)
        self.combo.setEnabled(True)
        self._choice = info["choice"]
        self._select(info["choice"])
        self.show_error(info.get("problem"))

    def show_error(self, message: str | None) -> None:
        self.problem.setText(message or "")
        self.problem.setVisible(bool(message))

    def _select(self, choice: str) -> None:
        index = self.combo.findData(choice)
        if index < 0:  # a custom file: listed by its name, above the entry that picks another
            self.combo.insertItem(self.combo.count() - 1, f"custom: {Path(choice).name}", choice)
            index = self.combo.findData(choice)
        self.combo.setCurrentIndex(index)

    def _activated(self, index: int) -> None:
        value = self.combo.itemData(index)
        if value == CUSTOM:
            path, _ = QFileDialog.getOpenFileName(self, "Chat template", "", "Jinja templates (*.jinja *.j2 *.txt)")
            if not path:
                self._select(self._choice)
                return
            value = path
        self.chosen.emit(value)

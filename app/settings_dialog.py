"""Per-chat system prompt and sampler settings."""
from __future__ import annotations

from PySide6.QtWidgets import (
    QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QLabel, QPlainTextEdit, QSpinBox, QVBoxLayout, QWidget,
)

from app.adapter_picker import AdapterPicker
from app.store import ChatSettings


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def _unescape(s: str) -> str:
    """Stop strings are typed one per line, so a newline inside one is written as \\n."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            out.append({"n": "\n", "t": "\t", "\\": "\\"}.get(s[i + 1], s[i : i + 2]))
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


class SettingsDialog(QDialog):
    def __init__(self, settings: ChatSettings, title: str = "Chat settings", parent: QWidget | None = None,
                 adapters: list[str] = ()):
        super().__init__(parent)
        self.loras = AdapterPicker(list(adapters), settings.loras)  # adapters: the loaded ones
        self.setWindowTitle(title)
        self.system_prompt = QPlainTextEdit(settings.system_prompt)
        self.system_prompt.setMinimumHeight(80)
        self.temperature = self._double(0.0, 5.0, 0.05, settings.temperature)
        self.top_k = self._int(0, 100000, settings.top_k, "off")
        self.top_p = self._double(0.01, 1.0, 0.05, settings.top_p)
        self.min_p = self._double(0.0, 0.99, 0.01, settings.min_p)
        self.repetition_penalty = self._double(0.5, 3.0, 0.005, settings.repetition_penalty, decimals=3)
        self.max_new_tokens = self._int(1, 1 << 20, settings.max_new_tokens)
        self.seed = self._int(-1, 2**31 - 1, -1 if settings.seed is None else settings.seed, "random")
        self.stop_strings = QPlainTextEdit("\n".join(_escape(s) for s in settings.stop_strings))
        self.stop_strings.setPlaceholderText("one per line; write a newline as \\n")
        self.stop_strings.setMaximumHeight(70)
        self.error = QLabel()
        self.error.setStyleSheet("color: #c0392b")
        self.error.setWordWrap(True)

        form = QFormLayout()
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-k", self.top_k)
        form.addRow("Top-p", self.top_p)
        form.addRow("Min-p", self.min_p)
        form.addRow("Repetition penalty", self.repetition_penalty)
        form.addRow("Max new tokens", self.max_new_tokens)
        form.addRow("Seed", self.seed)
        form.addRow("Stop strings", self.stop_strings)
        form.addRow("LoRA", self.loras)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
            | QDialogButtonBox.StandardButton.RestoreDefaults
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(self._defaults)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

    @staticmethod
    def _double(lo: float, hi: float, step: float, value: float, decimals: int = 2) -> QDoubleSpinBox:
        w = QDoubleSpinBox()
        w.setRange(lo, hi)
        w.setDecimals(decimals)
        w.setSingleStep(step)
        w.setValue(value)
        return w

    @staticmethod
    def _int(lo: int, hi: int, value: int, special: str | None = None) -> QSpinBox:
        w = QSpinBox()
        w.setRange(lo, hi)
        if special:
            w.setSpecialValueText(special)
        w.setValue(value)
        return w

    def settings(self) -> ChatSettings:
        """The dialog's values as validated settings (ValueError names a bad field)."""
        stops = tuple(_unescape(line) for line in self.stop_strings.toPlainText().split("\n") if line)
        return ChatSettings(
            system_prompt=self.system_prompt.toPlainText(),
            temperature=round(self.temperature.value(), 4),
            top_k=self.top_k.value(),
            top_p=round(self.top_p.value(), 4),
            min_p=round(self.min_p.value(), 4),
            repetition_penalty=round(self.repetition_penalty.value(), 4),
            max_new_tokens=self.max_new_tokens.value(),
            seed=None if self.seed.value() < 0 else self.seed.value(),
            stop_strings=stops,
            loras=self.loras.value(),
        ).validate()

    def _defaults(self) -> None:
        d = ChatSettings()
        self.system_prompt.setPlainText(d.system_prompt)
        self.temperature.setValue(d.temperature)
        self.top_k.setValue(d.top_k)
        self.top_p.setValue(d.top_p)
        self.min_p.setValue(d.min_p)
        self.repetition_penalty.setValue(d.repetition_penalty)
        self.max_new_tokens.setValue(d.max_new_tokens)
        self.seed.setValue(-1)
        self.stop_strings.setPlainText("")
        self.loras.set_value(d.loras)

    def accept(self) -> None:
        try:
            self.settings()
        except ValueError as exc:
            self.error.setText(str(exc))
            return
        super().accept()

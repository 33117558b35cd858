"""Per-chat system prompt and sampler settings, with sampler presets and the engine's advanced samplers."""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QHBoxLayout, QInputDialog, QLabel,
    QPlainTextEdit, QPushButton, QSpinBox, QTabWidget, QVBoxLayout, QWidget,
)

from app.core.context import SETTING_NAME
from app.core.context_window import POLICIES, POLICY_LABELS
from app.core.presets import PRESET_FIELDS, apply_preset, matching_preset, preset_of
from app.core.store import ChatSettings
from app.panels.adapter_picker import AdapterPicker
from app.preferences.preferences import Preferences

CUSTOM = "Custom"


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
                 prefs: Preferences | None = None, adapters: list[str] = ()):
        super().__init__(parent)
        self.loras = AdapterPicker(list(adapters), settings.loras)  # adapters: the loaded ones
        self.setWindowTitle(title)
        self.prefs = prefs if prefs is not None else Preferences()
        self._base = settings  # fields this dialog doesn't show are kept as they were
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setMinimumHeight(80)
        self.preset = QComboBox()
        self.save_preset_btn = QPushButton("Save as preset…")
        self.delete_preset_btn = QPushButton("Delete")
        self.delete_preset_btn.setToolTip("Delete this preset (yours only; the built-in ones stay)")
        for b in (self.save_preset_btn, self.delete_preset_btn):
            b.setAutoDefault(False)
        self.temperature = self._double(0.0, 5.0, 0.05)
        self.top_k = self._int(0, 100000, "off")
        self.top_p = self._double(0.01, 1.0, 0.05)
        self.min_p = self._double(0.0, 0.99, 0.01)
        self.repetition_penalty = self._double(0.5, 3.0, 0.005, decimals=3)
        self.max_new_tokens = self._int(0, 1 << 20, "until the context is full")  # 0: no limit (None)
        self.seed = self._int(-1, 2**31 - 1, "random")
        self.stop_strings = QPlainTextEdit()
        self.stop_strings.setPlaceholderText("one per line; write a newline as \\n")
        self.stop_strings.setMaximumHeight(70)
        self.json_mode = QCheckBox("JSON mode: the reply is one JSON object")
        self.stop_on_loops = QCheckBox("Stop replies that repeat themselves")
        self.stop_on_loops.setToolTip("End a reply that repeats one sentence or phrase a 4th time (local model)")
        self.context_overflow = QComboBox()  # the items' data: app.core.context_window's policy names
        for policy in POLICIES:
            self.context_overflow.addItem(POLICY_LABELS[policy], policy)
        self.context_overflow.setToolTip(
            "When the chat no longer fits the model's context (the stored chat never changes, only the prompt):\n"
            "Truncate middle: keep the system prompt, pinned documents, the first turn, turns with images and the\n"
            "latest turns; leave out whole turns from the middle.\n"
            "Rolling window: keep the system prompt and as many of the latest turns as fit.\n"
            "Stop at limit: leave nothing out; the reply stops when the context is full.")
        self.dry_multiplier = self._double(0.0, 10.0, 0.1, special="off")
        self.dry_base = self._double(1.0, 10.0, 0.05)
        self.dry_allowed_length = self._int(1, 1000)
        self.mirostat = QCheckBox("Mirostat (targets a steady surprise instead of top-k/top-p)")
        self.mirostat_tau = self._double(0.01, 20.0, 0.1)
        self.mirostat_eta = self._double(0.0, 1.0, 0.01)
        self.xtc_probability = self._double(0.0, 1.0, 0.05, special="off")
        self.xtc_threshold = self._double(0.0, 1.0, 0.01)
        self.error = QLabel()
        self.error.setStyleSheet("color: #c0392b")
        self.error.setWordWrap(True)

        general = QFormLayout()
        preset_row = QHBoxLayout()
        preset_row.addWidget(self.preset, 1)
        preset_row.addWidget(self.save_preset_btn)
        preset_row.addWidget(self.delete_preset_btn)
        general.addRow("System prompt", self.system_prompt)
        general.addRow("Preset", preset_row)
        general.addRow("Temperature", self.temperature)
        general.addRow("Top-k", self.top_k)
        general.addRow("Top-p", self.top_p)
        general.addRow("Min-p", self.min_p)
        general.addRow("Repetition penalty", self.repetition_penalty)
        general.addRow("Max new tokens", self.max_new_tokens)
        general.addRow("Seed", self.seed)
        general.addRow("Stop strings", self.stop_strings)
        general.addRow(self.stop_on_loops)
        advanced = QFormLayout()
        advanced.addRow(self.json_mode)
        advanced.addRow(QLabel("<b>DRY</b> (penalises repeating earlier sequences)"))
        advanced.addRow("Multiplier", self.dry_multiplier)
        advanced.addRow("Base", self.dry_base)
        advanced.addRow("Allowed length", self.dry_allowed_length)
        advanced.addRow(QLabel("<b>Mirostat</b>"))
        advanced.addRow(self.mirostat)
        advanced.addRow("Tau (target surprise)", self.mirostat_tau)
        advanced.addRow("Eta (learning rate)", self.mirostat_eta)
        advanced.addRow(QLabel("<b>XTC</b> (sometimes excludes the top choices)"))
        advanced.addRow("Probability", self.xtc_probability)
        advanced.addRow("Threshold", self.xtc_threshold)
        chat = QFormLayout()  # what the reply runs with beyond sampling
        chat.addRow("LoRA", self.loras)
        chat.addRow(SETTING_NAME, self.context_overflow)
        tabs = QTabWidget()
        for name, form in (("General", general), ("Advanced sampling", advanced), ("LoRA and context", chat)):
            page = QWidget()
            page.setLayout(form)
            tabs.addTab(page, name)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
            | QDialogButtonBox.StandardButton.RestoreDefaults
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(self._defaults)
        layout = QVBoxLayout(self)
        layout.addWidget(tabs)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

        self._load(settings)
        self.preset.activated.connect(lambda _i: self.choose_preset(self.preset.currentText()))
        self.save_preset_btn.clicked.connect(self._ask_preset_name)
        self.delete_preset_btn.clicked.connect(lambda: self.delete_preset(self.preset.currentText()))
        for name in PRESET_FIELDS:
            w = getattr(self, name)
            (w.toggled if isinstance(w, QCheckBox) else w.valueChanged).connect(self._show_preset)

    @staticmethod
    def _double(lo: float, hi: float, step: float, decimals: int = 2, special: str | None = None) -> QDoubleSpinBox:
        w = QDoubleSpinBox()
        w.setRange(lo, hi)
        w.setDecimals(decimals)
        w.setSingleStep(step)
        if special:
            w.setSpecialValueText(special)
        return w

    @staticmethod
    def _int(lo: int, hi: int, special: str | None = None) -> QSpinBox:
        w = QSpinBox()
        w.setRange(lo, hi)
        if special:
            w.setSpecialValueText(special)
        return w

    def _load(self, s: ChatSettings) -> None:
        self.system_prompt.setPlainText(s.system_prompt)
        self.max_new_tokens.setValue(s.max_new_tokens or 0)
        self.seed.setValue(-1 if s.seed is None else s.seed)
        self.stop_strings.setPlainText("\n".join(_escape(x) for x in s.stop_strings))
        self.json_mode.setChecked(s.json_mode)
        self.stop_on_loops.setChecked(s.stop_on_loops)
        self.context_overflow.setCurrentIndex(self.context_overflow.findData(s.context_overflow))
        self.loras.set_value(s.loras)
        self._load_sampler(preset_of(s))

    def _load_sampler(self, values: dict) -> None:
        for name, value in values.items():
            w = getattr(self, name)
            w.blockSignals(True)
            w.setChecked(value) if isinstance(w, QCheckBox) else w.setValue(value)
            w.blockSignals(False)
        self._show_preset()

    def _sampler_values(self) -> dict:
        out = {}
        for name in PRESET_FIELDS:
            w = getattr(self, name)
            value = w.isChecked() if isinstance(w, QCheckBox) else w.value()
            out[name] = round(value, 4) if isinstance(value, float) else value
        return out

    def _show_preset(self, *_args) -> None:
        """The combo names the preset the values match, or says Custom."""
        presets = self.prefs.presets()
        probe = replace(ChatSettings(), **self._sampler_values())
        name = matching_preset(probe, presets) or CUSTOM
        self.preset.blockSignals(True)
        self.preset.clear()
        self.preset.addItems(list(presets) + ([CUSTOM] if name == CUSTOM else []))
        self.preset.setCurrentText(name)
        self.preset.blockSignals(False)
        self.delete_preset_btn.setEnabled(name in self.prefs.user_presets())

    def choose_preset(self, name: str) -> None:
        """Take a preset's sampler values (the other settings stay)."""
        presets = self.prefs.presets()
        if name in presets:
            self._load_sampler(preset_of(apply_preset(ChatSettings(), presets[name])))

    def save_preset(self, name: str) -> None:
        """Save the dialog's sampler values as a user preset (ValueError if the name or values are bad)."""
        self.prefs.save_preset(name, self._sampler_values())
        self._show_preset()

    def delete_preset(self, name: str) -> None:
        """Forget a user preset (the values in the dialog stay; they now read as Custom)."""
        self.prefs.delete_preset(name)
        self._show_preset()

    def _ask_preset_name(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Preset name:")
        if ok:
            try:
                self.save_preset(name)
            except ValueError as exc:
                self.error.setText(str(exc))

    def settings(self) -> ChatSettings:
        """The dialog's values as validated settings (ValueError names a bad field)."""
        stops = tuple(_unescape(line) for line in self.stop_strings.toPlainText().split("\n") if line)
        return replace(
            self._base,
            system_prompt=self.system_prompt.toPlainText(),
            max_new_tokens=self.max_new_tokens.value() or None,
            seed=None if self.seed.value() < 0 else self.seed.value(),
            stop_strings=stops,
            json_mode=self.json_mode.isChecked(),
            stop_on_loops=self.stop_on_loops.isChecked(),
            context_overflow=self.context_overflow.currentData(),
            loras=self.loras.value(),
            **self._sampler_values(),
        ).validate()

    def _defaults(self) -> None:
        """What a new chat starts with (the default system prompt and preset from Preferences)."""
        self._load(self.prefs.new_chat_settings())

    def accept(self) -> None:
        try:
            self.settings()
        except ValueError as exc:
            self.error.setText(str(exc))
            return
        super().accept()

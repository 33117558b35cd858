"""The Preferences dialog: theme and font size (applied live while it is open), what new chats start with, and
the order replies keep their cache pages in (app.preferences.reply_order)."""
from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QPlainTextEdit, QSpinBox, QVBoxLayout, QWidget,
)

from app.core.presets import BUILTIN_PRESETS
from app.preferences.preferences import FONT_SIZES, THEMES
from app.preferences.reply_order import ReplyOrder
from app.preferences.theme import Theme


class PreferencesDialog(QDialog):
    """OK keeps the changes; Cancel puts the theme and font size back as they were."""

    def __init__(self, theme: Theme, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Preferences")
        self.theme = theme
        self.prefs = theme.prefs
        self._before = (self.prefs.theme, self.prefs.font_size)
        self.theme_box = QComboBox()
        for mode in THEMES:
            self.theme_box.addItem({"system": "Follow the system"}.get(mode, mode.capitalize()), mode)
        self.theme_box.setCurrentIndex(THEMES.index(self.prefs.theme))
        self.font_size = QSpinBox()
        self.font_size.setRange(FONT_SIZES[0] - 1, FONT_SIZES[1])  # the value below the range: system default
        self.font_size.setSpecialValueText("system default")
        self.font_size.setSuffix(" pt")
        self.font_size.setValue(self.prefs.font_size or FONT_SIZES[0] - 1)
        self.system_prompt = QPlainTextEdit(self.prefs.system_prompt)
        self.system_prompt.setMinimumHeight(70)
        self.preset = QComboBox()
        presets = self.prefs.presets()
        for name in presets:
            self.preset.addItem(name if name in BUILTIN_PRESETS else f"{name} (yours)", name)
        self.preset.setCurrentIndex(list(presets).index(self.prefs.preset))
        backend = getattr(parent, "backend", None)  # the window's: does it rank replies (a remote server does not)
        self.reply_order = ReplyOrder(self.prefs.reply_order, getattr(backend, "ranks_replies", None))

        form = QFormLayout()
        form.addRow("Theme", self.theme_box)
        form.addRow("Font size", self.font_size)
        form.addRow(QLabel("<b>New chats start with</b>"))
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Sampler preset", self.preset)
        form.addRow(QLabel("<b>When the cache runs short, replies keep their pages in this order</b>"))
        form.addRow(self.reply_order)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(buttons)
        self.theme_box.currentIndexChanged.connect(lambda _i: self.theme.set_mode(self.theme_box.currentData()))
        self.font_size.valueChanged.connect(lambda v: self.theme.set_font_size(0 if v < FONT_SIZES[0] else v))

    def accept(self) -> None:
        self.prefs.system_prompt = self.system_prompt.toPlainText()
        self.prefs.preset = self.preset.currentData()
        self.prefs.reply_order = self.reply_order.order()
        chats = getattr(self.parent(), "chats", None)  # the window's chat area: running replies take the new order
        if chats is not None:
            chats.rank_replies()
        super().accept()

    def reject(self) -> None:
        self.prefs.theme, self.prefs.font_size = self._before
        self.theme.apply()
        super().reject()

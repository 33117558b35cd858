"""What a new, empty chat shows instead of a blank transcript: where to start.

The model the chat will answer with (or, with none loaded, a button to pick one), the sampler presets
(the chat's own is marked; a click applies another) and a few example prompts that fill the message box
when clicked (they are not sent: the user reads, edits, then presses Enter). It lies over the
conversation's viewport and goes as soon as the chat has a message.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

from app.preferences.design_tokens import ICON, SPACE, TYPE, stylesheet
from app.preferences.icons import icon
from app.preferences.theme import is_dark

EXAMPLES = (
    "Explain a Python decorator with a short example",
    "Summarise the pros and cons of SQLite",
    "Write a haiku about autumn leaves",
    "Plan a three-day trip to Lisbon",
)


class EmptyState(QWidget):
    """The start page of an empty chat (model, presets, example prompts), sized to its parent."""

    pick_model = Signal()  # "Choose a model…" pressed
    example_chosen = Signal(str)  # an example prompt's text
    preset_chosen = Signal(str)  # a preset's name

    def __init__(self, parent: QWidget):
        super().__init__(parent)
        self.setObjectName("emptyState")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, False)
        self._dark: bool | None = None
        col = QVBoxLayout(self)
        col.setContentsMargins(SPACE["lg"], SPACE["lg"], SPACE["lg"], SPACE["lg"])
        col.setSpacing(SPACE["sm"])
        col.addStretch(1)
        self.title = QLabel("Start a conversation")
        self.title.setObjectName("emptyTitle")
        self.title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        font = QFont(self.font())
        font.setPointSizeF(font.pointSizeF() * TYPE["title"])
        font.setBold(True)
        self.title.setFont(font)
        col.addWidget(self.title)

        self.model_label = QLabel()
        self.model_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.model_label.setWordWrap(True)
        self.model_btn = QPushButton("Choose a model…")
        self.model_btn.setToolTip("Pick a recent model and load it (Ctrl+M)")
        self.model_btn.setAccessibleName("Choose a model")
        self.model_btn.clicked.connect(self.pick_model)
        col.addWidget(self.model_label)
        col.addLayout(self._centred([self.model_btn]))

        self.presets_row = QHBoxLayout()
        self.presets_row.setSpacing(SPACE["xs"])
        self.presets_label = QLabel("Preset:")
        self.preset_buttons: dict[str, QPushButton] = {}
        col.addLayout(self._centred([self.presets_label], self.presets_row))

        self.examples_label = QLabel("Try one of these:")
        self.examples_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        col.addSpacing(SPACE["sm"])
        col.addWidget(self.examples_label)
        self.example_buttons: list[QPushButton] = []
        for text in EXAMPLES:
            b = ExampleButton(text)
            b.setToolTip(f"{text}\nPuts this prompt in the message box (Enter sends it)")
            b.setAccessibleName(f"Example prompt: {text}")
            b.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)  # a narrow tile elides, not widens
            b.clicked.connect(lambda _=False, t=text: self.example_chosen.emit(t))
            self.example_buttons.append(b)
            col.addLayout(self._centred([b]))
        col.addStretch(2)
        self._restyle()
        parent.installEventFilter(self)
        self.setGeometry(parent.rect())

    @staticmethod
    def _centred(widgets: list[QWidget], row: QHBoxLayout | None = None) -> QHBoxLayout:
        row = row if row is not None else QHBoxLayout()
        row.addStretch(1)
        for w in widgets:
            row.addWidget(w, 6 if isinstance(w, QPushButton) and w.sizePolicy().horizontalPolicy()
                          == QSizePolicy.Policy.Ignored else 0)
        row.addStretch(1)
        return row

    def set_model(self, name: str | None) -> None:
        """The model new replies come from (None: none loaded, so offer to pick one); colours of the theme now."""
        self._restyle()
        self.model_label.setText(f"Replies come from {name}" if name else "No model is loaded yet.")
        self.model_btn.setText("Switch model…" if name else "Choose a model…")
        self.model_btn.setAccessibleName("Switch model" if name else "Choose a model")

    def set_presets(self, names: list[str], current: str | None) -> None:
        """One button per preset; the chat's own (None: custom values) is checked."""
        if list(self.preset_buttons) != names:
            for b in self.preset_buttons.values():
                self.presets_row.removeWidget(b)
                b.deleteLater()
            self.preset_buttons = {}
            at = self.presets_row.indexOf(self.presets_label) + 1
            for i, name in enumerate(names):
                b = QPushButton(name)
                b.setCheckable(True)
                b.setToolTip(f"Sample this chat's replies with the {name} preset")
                b.setAccessibleName(f"Preset {name}")
                b.clicked.connect(lambda _=False, n=name: self.preset_chosen.emit(n))
                self.presets_row.insertWidget(at + i, b)
                self.preset_buttons[name] = b
        for name, b in self.preset_buttons.items():
            b.setChecked(name == current)
        self.fit()

    def fit(self) -> None:
        """Drop what the height cannot hold (the last examples first, then the presets, then the model line)
        rather than squash it: a short tile shows fewer suggestions, each one whole."""
        groups = [[b] for b in reversed(self.example_buttons[1:])] + [
            [self.example_buttons[0], self.examples_label], [self.presets_label, *self.preset_buttons.values()],
            [self.model_label]]
        for group in groups:
            for w in group:
                w.setVisible(True)
        layout = self.layout()
        for group in groups:
            layout.activate()
            if layout.minimumSize().height() <= self.height():
                break
            for w in group:
                w.setVisible(False)

    def _restyle(self) -> None:
        if self._dark == is_dark():
            return
        self._dark = is_dark()
        self.setStyleSheet(stylesheet(self._dark))
        self.model_btn.setIcon(icon("model"))
        self.model_btn.setIconSize(QSize(ICON, ICON))

    def changeEvent(self, e) -> None:  # noqa: N802
        super().changeEvent(e)
        if e.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._restyle()

    def eventFilter(self, obj, e) -> bool:  # noqa: N802
        if obj is self.parentWidget() and e.type() == QEvent.Type.Resize:
            self.setGeometry(obj.rect())
            self.fit()
        return False


class ExampleButton(QPushButton):
    """An example prompt's button: in a pane too narrow for the whole prompt it shows the prompt elided with
    "…" (whole in its tooltip and accessible name) rather than cut off mid-letter; text() is the whole prompt."""

    def __init__(self, prompt: str) -> None:
        super().__init__(prompt)
        self.prompt = prompt

    def text(self) -> str:  # noqa: D102 (the whole prompt, whatever is shown)
        return self.prompt

    def shown(self) -> str:
        return super().text()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        super().resizeEvent(event)
        metrics = self.fontMetrics()
        shown = super().text()
        padding = self.sizeHint().width() - metrics.horizontalAdvance(shown)  # the style's margins at this font
        elided = metrics.elidedText(self.prompt, Qt.TextElideMode.ElideRight, max(0, self.width() - padding))
        if elided != shown:
            self.setText(elided)

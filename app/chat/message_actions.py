"""A message's actions (edit, copy, branch from here, regenerate, continue) as small icon buttons over it.

The bar floats at the top right of the message under the mouse, and of the message holding the
conversation's text cursor while the conversation has keyboard focus (Tab then reaches its buttons, which
sit between the conversation and the message box in the pane's tab order). Hidden, it takes no room in the
transcript: reading stays free of a row of links under every message. Each button has the action's name as
tooltip and accessible name; pressing one does what the transcript's `pd:<verb>/<id>` link does.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QEvent, QObject, QPoint, QSize, Qt
from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QTextBrowser, QToolButton

from app.chat.transcript import Transcript
from app.preferences.design_tokens import ICON, SPACE, stylesheet
from app.preferences.icons import icon
from app.preferences.theme import is_dark

# verb -> (icon, what the button says it does)
ACTIONS = {
    "edit": ("edit", "Edit this message"),
    "copy": ("copy", "Copy this message"),
    "branch": ("branch", "Branch from here"),
    "regen": ("regenerate", "Regenerate this reply"),
    "continue": ("continue", "Continue this reply"),
}


class MessageActionBar(QFrame):
    """The icon buttons of one message at a time, shown over a QTextBrowser's viewport."""

    def __init__(self, view: QTextBrowser, transcript: Transcript, act: Callable[[str, int], None]):
        super().__init__(view.viewport())
        self.setObjectName("messageActions")
        self.view, self.transcript, self._act = view, transcript, act
        self.message_id: int | None = None
        self._dark: bool | None = None
        row = QHBoxLayout(self)
        row.setContentsMargins(SPACE["xxs"], SPACE["xxs"], SPACE["xxs"], SPACE["xxs"])
        row.setSpacing(SPACE["xxs"])
        self.buttons: dict[str, QToolButton] = {}
        for verb, (_icon, label) in ACTIONS.items():
            b = QToolButton(self)
            b.setObjectName("messageAction")
            b.setIconSize(QSize(ICON, ICON))
            b.setToolTip(label)
            b.setAccessibleName(label)
            b.setFocusPolicy(Qt.FocusPolicy.TabFocus)
            b.clicked.connect(lambda _=False, v=verb: self._pressed(v))
            row.addWidget(b)
            self.buttons[verb] = b
        self._restyle()
        self.hide()
        view.viewport().setMouseTracking(True)
        view.viewport().installEventFilter(self)
        view.installEventFilter(self)
        view.cursorPositionChanged.connect(self._cursor_moved)
        view.verticalScrollBar().valueChanged.connect(lambda _v: self._place())
        QApplication.instance().focusChanged.connect(self._focus_changed)

    def show_for(self, message_id: int | None) -> None:
        """Show the bar over message `message_id` with that message's actions (hide it for None or none)."""
        actions = [v for v, _ in self.transcript.bar_actions(message_id)] if message_id is not None else []
        if not actions:
            self.message_id = None
            self.hide()
            return
        self.message_id = message_id
        for verb, b in self.buttons.items():
            b.setVisible(verb in actions)
        self.adjustSize()
        self._place()
        self.show()
        self.raise_()

    def refresh(self) -> None:
        """After the transcript was rebuilt (a new theme rebuilds it too): the theme's colours, the same message's
        (new) actions, or hidden if it is gone."""
        self._restyle()
        if self.message_id is not None:
            self.show_for(self.message_id if self.message_id in self.transcript.headers else None)

    def _pressed(self, verb: str) -> None:
        if self.message_id is not None:
            self._act(verb, self.message_id)

    def _place(self) -> None:
        if self.message_id is None or self.message_id not in self.transcript.headers:
            return
        doc = self.view.document()
        block = doc.findBlock(self.transcript.headers[self.message_id][0])
        top = doc.documentLayout().blockBoundingRect(block).top() - self.view.verticalScrollBar().value()
        x = self.view.viewport().width() - self.width() - SPACE["sm"]
        self.move(QPoint(max(0, x), max(0, int(top))))

    def _restyle(self) -> None:
        if self._dark == is_dark():
            return
        self._dark = is_dark()
        self.setStyleSheet(stylesheet(self._dark))
        for verb, b in self.buttons.items():
            b.setIcon(icon(ACTIONS[verb][0]))

    def changeEvent(self, e) -> None:  # noqa: N802
        super().changeEvent(e)
        if e.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):  # a new theme: colours, icons
            self._restyle()

    def eventFilter(self, obj: QObject, e: QEvent) -> bool:  # noqa: N802
        if obj is self.view.viewport():
            if e.type() == QEvent.Type.MouseMove:
                self.show_for(self.transcript.message_at(self.view.cursorForPosition(e.position().toPoint()).position()))
            elif e.type() == QEvent.Type.Leave and not self._has_focus():
                self.hide()
            elif e.type() == QEvent.Type.Resize:
                self._place()
        elif obj is self.view and e.type() == QEvent.Type.FocusIn:
            self._cursor_moved()
        return False

    def _cursor_moved(self) -> None:
        if self.view.hasFocus():
            self.show_for(self.transcript.message_at(self.view.textCursor().position()))

    def _has_focus(self) -> bool:
        return any(b.hasFocus() for b in self.buttons.values())

    def _focus_changed(self, _old, new) -> None:
        if self.isVisible() and new is not self.view and new not in self.buttons.values() \
                and not self.underMouse():
            self.hide()

"""PromptEdit: a chat pane's prompt box (Enter sends; a pasted or dropped image becomes an attachment)."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QKeyCombination, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit

from app.chat.attachments import Attachments, carries_image


PALETTE_KEY = QKeyCombination(Qt.KeyboardModifier.ControlModifier, Qt.Key.Key_K)


class PromptEdit(QPlainTextEdit):
    """Enter sends, Shift+Enter inserts a newline."""

    submitted = Signal()
    attachments: Attachments | None = None  # a pasted or dropped image goes there, not into the text

    def canInsertFromMimeData(self, source) -> bool:  # noqa: N802
        return (self.attachments is not None and carries_image(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source) -> None:  # noqa: N802
        if self.attachments is None or not self.attachments.add_mime(source):
            super().insertFromMimeData(source)

    def grow(self, min_lines: int, max_lines: int) -> None:
        """Be as tall as the text (wrapped lines) between min_lines and max_lines, scrolling past that: a short
        message leaves the conversation its room, a long one is seen whole while it is written."""
        self._lines = (min_lines, max_lines)
        self.document().documentLayout().documentSizeChanged.connect(lambda _size: self._fit_height())
        self._fit_height()

    def _fit_height(self) -> None:
        low, high = self._lines
        lines = min(max(int(self.document().size().height()), low), high)  # a plain-text layout counts lines
        margins = self.contentsMargins()
        height = (lines * self.fontMetrics().lineSpacing() + 2 * int(self.document().documentMargin())
                  + margins.top() + margins.bottom() + 2)
        if height != self.height() or self.minimumHeight() != height:
            self.setFixedHeight(height)

    def changeEvent(self, e) -> None:  # noqa: N802
        super().changeEvent(e)
        if e.type() == QEvent.Type.FontChange and getattr(self, "_lines", None):
            self._fit_height()

    def event(self, e) -> bool:
        """The window's Ctrl+K (command palette) wins over the text box's delete-to-end-of-line."""
        if e.type() == QEvent.Type.ShortcutOverride and e.keyCombination() == PALETTE_KEY:
            e.ignore()
            return True
        return super().event(e)

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not e.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(e)

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

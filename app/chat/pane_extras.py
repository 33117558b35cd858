"""The rows under a chat's prompt box: its queued messages and its pinned documents.

Both lists come from the chat's session (and so from the store), rebuilt when it says they changed.
Each queued message has Edit (its text goes back into the prompt box; sending saves it in place) and
Cancel; each pinned document shows its size in tokens and has Unpin. Rows hide when their list is empty,
and every text is elided, so a long message or file name never widens the pane.
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QToolButton, QVBoxLayout, QWidget

from app.chat.chat_session import ChatSession
from app.chat.pane_widgets import ElidedLabel
from app.core.message_queue import QueuedMessage
from app.preferences.theme import quiet_text

MAX_ROWS_SHOWN = 4  # more queued messages are summed up in one line


class QueueList(QWidget):
    """The chat's queue: one row per waiting message, the next to send first."""

    edit_requested = Signal(object)  # the QueuedMessage to edit

    def __init__(self, session: ChatSession, parent: QWidget | None = None):
        super().__init__(parent)
        self.session = session
        self.rows: list[tuple[QueuedMessage, QToolButton, QToolButton]] = []
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(0)
        session.queue_changed.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        while (item := self._layout.takeAt(0)) is not None:
            if item.widget() is not None:
                item.widget().deleteLater()
        self.rows = []
        items = [] if self.session.store.closed else self.session.queued()
        for n, queued in enumerate(items[:MAX_ROWS_SHOWN]):
            row = QWidget()
            line = QHBoxLayout(row)
            line.setContentsMargins(0, 0, 0, 0)
            label = ElidedLabel(f"queued {n + 1}: {queued.content}")
            label.setStyleSheet(f"color: {quiet_text().name()}")
            edit, cancel = QToolButton(text="Edit"), QToolButton(text="✕")
            cancel.setToolTip("Cancel this queued message")
            edit.setAccessibleName(f"Edit queued message {n + 1}")
            cancel.setAccessibleName(f"Cancel queued message {n + 1}")
            edit.clicked.connect(lambda _=False, q=queued: self.edit_requested.emit(q))
            cancel.clicked.connect(lambda _=False, q=queued: self.session.cancel_queued(q.id))
            line.addWidget(label, 1)
            line.addWidget(edit)
            line.addWidget(cancel)
            self._layout.addWidget(row)
            self.rows.append((queued, edit, cancel))
        if len(items) > MAX_ROWS_SHOWN:
            more = ElidedLabel(f"… and {len(items) - MAX_ROWS_SHOWN} more queued")
            more.setStyleSheet(f"color: {quiet_text().name()}")
            self._layout.addWidget(more)
        self.setVisible(bool(items))


class PinnedList(QWidget):
    """The chat's pinned documents, each with its size and an Unpin button."""

    def __init__(self, session: ChatSession, parent: QWidget | None = None):
        super().__init__(parent)
        self.session = session
        self.labels: list[ElidedLabel] = []
        self.unpin_buttons: list[QToolButton] = []
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(0)
        session.documents_changed.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        while (item := self._layout.takeAt(0)) is not None:
            if item.widget() is not None:
                item.widget().deleteLater()
        self.labels, self.unpin_buttons = [], []
        docs = [] if self.session.store.closed else self.session.pinned()
        for doc in docs:
            row = QWidget()
            line = QHBoxLayout(row)
            line.setContentsMargins(0, 0, 0, 0)
            tokens = self.session.backend.count_tokens([{"role": "user", "content": doc.content}],
                                                       self.session.settings)
            size = f"{tokens:,} tokens" if tokens is not None else f"{len(doc.content):,} characters"
            label = ElidedLabel(f"Pinned: {doc.name} · {size} · a prefix shared with every chat pinning it")
            label.setStyleSheet("color: #3a6ea5")
            unpin = QToolButton(text="Unpin")
            unpin.setAccessibleName(f"Unpin {doc.name}")
            unpin.clicked.connect(lambda _=False, d=doc: self.session.unpin_document(d.id))
            line.addWidget(label, 1)
            line.addWidget(unpin)
            self._layout.addWidget(row)
            self.labels.append(label)
            self.unpin_buttons.append(unpin)
        self.setVisible(bool(docs))

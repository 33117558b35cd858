"""StoreNotice: what happened to the history database, said in the window until the user dismisses it.

Shown for a damaged file moved aside or a read-only file at start (app.core.store_open's notice), and for
every write the disk refuses while the app runs (a full disk while a reply streams: Store.write_failed).
A bar above the chats, not a status-bar message that the next message would replace.
"""
from __future__ import annotations

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton

from app.core.store import Store


class StoreNotice(QFrame):
    def __init__(self, store: Store, notice: str | None = None):
        super().__init__()
        self.setObjectName("storeNotice")
        self.setStyleSheet("#storeNotice { background: #fff3cd; color: #5c4400; border: 1px solid #e0b84c; }")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(self.label.textInteractionFlags() | self.label.textInteractionFlags().TextSelectableByMouse)
        close = QPushButton("Dismiss")
        close.clicked.connect(self.hide)
        row = QHBoxLayout(self)
        row.addWidget(self.label, 1)
        row.addWidget(close)
        self.hide()
        store.write_failed.append(lambda error: self.show_text(str(error)))
        if notice:
            self.show_text(notice)

    def show_text(self, text: str) -> None:
        self.label.setText(text)
        self.setVisible(True)

    @property
    def text(self) -> str:
        return self.label.text() if not self.isHidden() else ""

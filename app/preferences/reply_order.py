"""The Preferences dialog's reply order: the kinds of replies (app.core.priorities), the first one kept first
when the cache runs short of pages. Drag a row, or select it and use Up/Down (the keyboard's way)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QHBoxLayout, QLabel, QListWidget, QPushButton, QVBoxLayout, QWidget

from app.core.priorities import LABELS, check_order


class ReplyOrder(QWidget):
    def __init__(self, order: tuple[str, ...], ranks: bool | None = True, parent: QWidget | None = None):
        """`ranks`: whether the backend in use ranks replies (False: a remote server, said under the list)."""
        super().__init__(parent)
        self.list = QListWidget()
        self.list.setAccessibleName("Reply order: the first keeps its cache pages longest")
        self.list.setDragDropMode(QAbstractItemView.DragDropMode.InternalMove)
        for kind in check_order(order):
            self.list.addItem(LABELS[kind])
            self.list.item(self.list.count() - 1).setData(Qt.ItemDataRole.UserRole, kind)
        self.list.setMaximumHeight(self.list.sizeHintForRow(0) * (len(order) + 1) + 6)
        self.up, self.down = QPushButton("Up"), QPushButton("Down")
        self.up.clicked.connect(lambda: self.move(-1))
        self.down.clicked.connect(lambda: self.move(1))
        self.note = QLabel("The remote server ranks its requests itself: this order applies to the local engine.")
        self.note.setWordWrap(True)
        self.note.setVisible(ranks is False)
        buttons = QVBoxLayout()
        buttons.addWidget(self.up)
        buttons.addWidget(self.down)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.list, 1)
        row.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.note)

    def order(self) -> tuple[str, ...]:
        return tuple(self.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.list.count()))

    def move(self, step: int) -> None:
        """Move the selected kind one place up (-1) or down (1)."""
        i = self.list.currentRow()
        j = i + step
        if i < 0 or not 0 <= j < self.list.count():
            return
        item = self.list.takeItem(i)
        self.list.insertItem(j, item)
        self.list.setCurrentRow(j)

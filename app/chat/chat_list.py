"""The chat list: search, create, rename (in place), delete; activating a chat opens its pane.

Chats whose reply is under way (generating, queued or deferred; open or not) carry a mark: an icon in
their colour with a dot, and the state in the tooltip.

Rows are as wide as the list: a long title is elided ("…") with the full title in its tooltip, and the
list never scrolls sideways (a row as wide as its title would give every long title a scrollbar).
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView, QHBoxLayout, QLineEdit, QListWidget, QListWidgetItem, QMessageBox, QSizePolicy, QToolButton,
    QVBoxLayout, QWidget,
)

from app.chat.pane_widgets import ACTIVITY, activity_icon
from app.core.chat_colours import CHAT_COLOURS
from app.core.store import ChatSettings, Store

ID_ROLE = Qt.ItemDataRole.UserRole


class ChatList(QWidget):
    open_requested = Signal(int)  # chat id
    created = Signal(int)
    renamed = Signal(int, str)
    deleted = Signal(int)

    def __init__(self, store: Store, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self._activity: dict[int, str] = {}  # chat id -> its running reply's state
        self.new_chat_settings: Callable[[], ChatSettings] = ChatSettings  # the window gives Preferences'
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats…")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search chats")
        self.list = QListWidget()
        self.list.setAccessibleName("Chats")
        self.list.setAccessibleDescription("Enter opens a chat, F2 renames it, Delete deletes it")
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        # Tool buttons (as wide as their text, not a push button's 80-px minimum): the list's dock can give
        # its width to the tiles on a small screen.
        self.new_btn = QToolButton(text="New")
        self.new_btn.setToolTip("New chat (Ctrl+N)")
        self.rename_btn = QToolButton(text="Rename")
        self.rename_btn.setToolTip("Rename the selected chat (F2)")
        self.delete_btn = QToolButton(text="Delete")
        self.delete_btn.setToolTip("Delete the selected chats (Delete)")
        buttons = QHBoxLayout()
        for b in (self.new_btn, self.rename_btn, self.delete_btn):
            b.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addLayout(buttons)

        delete = QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.list,
                           context=Qt.ShortcutContext.WidgetShortcut)
        delete.activated.connect(self.delete_selected)
        self.search.textChanged.connect(lambda _t: self.refresh())
        self.list.itemActivated.connect(self._activated)
        self.list.itemClicked.connect(self._activated)
        self.list.itemChanged.connect(self._edited)
        self.new_btn.clicked.connect(lambda: self.new_chat())
        self.rename_btn.clicked.connect(self._edit_selected)
        self.delete_btn.clicked.connect(self.delete_selected)
        self.refresh()

    def refresh(self) -> None:
        """Reload from the store (most recent first), keeping the selection."""
        selected = set(self.selected_ids())
        self.list.blockSignals(True)
        self.list.clear()
        for chat in self.store.chats(self.search.text().strip()):
            item = QListWidgetItem(chat.title)
            item.setData(ID_ROLE, chat.id)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            self._mark(item)
            item.setSelected(chat.id in selected)
        self.list.blockSignals(False)

    def track(self, session) -> None:
        """Mark this chat session's item while it replies (ChatSession.activity_changed)."""
        chat_id = session.chat_id
        session.activity_changed.connect(lambda state: self.set_activity(chat_id, state))

    def set_activity(self, chat_id: int, state: str) -> None:
        if state:
            self._activity[chat_id] = state
        else:
            self._activity.pop(chat_id, None)
        for i in range(self.list.count()):
            if self.list.item(i).data(ID_ROLE) == chat_id:
                self.list.blockSignals(True)  # an icon change is not a rename
                self._mark(self.list.item(i))
                self.list.blockSignals(False)

    def activity(self, chat_id: int) -> str:
        return self._activity.get(chat_id, "")

    def _mark(self, item: QListWidgetItem) -> None:
        chat_id = item.data(ID_ROLE)
        state = self._activity.get(chat_id, "")
        item.setIcon(activity_icon(state, CHAT_COLOURS.colour(chat_id)) if state else QIcon())
        item.setToolTip(f"{item.text()} — {ACTIVITY[state][1]}" if state else item.text())
        item.setSizeHint(QSize())  # the delegate's height for this text and icon; the width of the list (below)
        item.setSizeHint(QSize(1, self.list.sizeHintForIndex(self.list.indexFromItem(item)).height()))

    def ids(self) -> list[int]:
        return [self.list.item(i).data(ID_ROLE) for i in range(self.list.count())]

    def titles(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def selected_ids(self) -> list[int]:
        return [it.data(ID_ROLE) for it in self.list.selectedItems()]

    def select(self, chat_id: int) -> None:
        for i in range(self.list.count()):
            item = self.list.item(i)
            item.setSelected(item.data(ID_ROLE) == chat_id)
            if item.data(ID_ROLE) == chat_id:
                self.list.setCurrentItem(item)

    def new_chat(self, title: str = "New chat") -> int:
        chat = self.store.create_chat(title, self.new_chat_settings())
        self.search.clear()
        self.refresh()
        self.select(chat.id)
        self.created.emit(chat.id)
        self.open_requested.emit(chat.id)
        return chat.id

    def rename(self, chat_id: int, title: str) -> None:
        self.store.rename_chat(chat_id, title)
        self.refresh()
        self.renamed.emit(chat_id, self.store.chat(chat_id).title)

    def delete(self, chat_ids: list[int]) -> None:
        for chat_id in chat_ids:
            self.deleted.emit(chat_id)  # the window closes the pane and stops its reply first
            self.store.delete_chat(chat_id)
        self.refresh()

    def delete_selected(self) -> None:
        ids = self.selected_ids()
        if ids and self.confirm_delete(len(ids)):
            self.delete(ids)

    def confirm_delete(self, n: int) -> bool:
        answer = QMessageBox.question(self, "Delete chats", f"Delete {n} chat{'s' if n > 1 else ''} and all messages?")
        return answer == QMessageBox.StandardButton.Yes

    def _activated(self, item: QListWidgetItem) -> None:
        self.open_requested.emit(item.data(ID_ROLE))

    def _edit_selected(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.list.editItem(item)

    def _edited(self, item: QListWidgetItem) -> None:
        chat_id = item.data(ID_ROLE)
        try:
            self.rename(chat_id, item.text())
        except ValueError:  # empty title: put the old one back
            self.refresh()

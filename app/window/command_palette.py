"""The command palette (Ctrl+K, Ctrl+Shift+P) and the quick pick it is made of.

QuickPick is a small dialog: a search box over a list; typing filters the list (every word typed must
appear in an entry, in any order; entries whose name has them all come before those whose description
completes them), Up/Down move, Enter picks, Esc closes. The palette fills it with every
command of the window's menus (collect_actions walks the menu bar, so a command added to a menu is found
with no list to keep), each with its menu, its keys and what it does; picking one triggers it. The
"Switch model" command fills one with the recent models.
"""
from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QDialog, QLabel, QLineEdit, QListWidget, QListWidgetItem, QMainWindow, QMenu, QVBoxLayout, QWidget,
)

from app.window.keymap import plain

DATA = Qt.ItemDataRole.UserRole


class QuickPick(QDialog):
    """Search box over a list of (text, detail, value) entries; picked(value) runs on Enter or a click."""

    def __init__(self, title: str, entries: list[tuple[str, str, Any]], picked: Callable[[Any], None],
                 parent: QWidget | None = None, placeholder: str = "Type to search…"):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.setAccessibleName(title)
        self.picked = picked
        self.entries = entries
        self.search = QLineEdit()
        self.search.setPlaceholderText(placeholder)
        self.search.setAccessibleName(f"{title}: search")
        self.search.setAccessibleDescription("Type words to filter the list; Up and Down choose, Enter runs")
        self.list = QListWidget()
        self.list.setAccessibleName(f"{title}: results")
        self.list.setUniformItemSizes(True)
        self.empty = QLabel("Nothing matches.")
        self.empty.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.empty)
        self.search.textChanged.connect(self.filter)
        self.search.installEventFilter(self)
        self.list.itemActivated.connect(self._activate)
        self.list.itemClicked.connect(self._activate)
        self.resize(520, 380)
        self.filter("")

    def filter(self, query: str) -> None:
        words = query.lower().split()
        self.list.clear()
        by_name = [e for e in self.entries if all(w in e[0].lower() for w in words)]
        by_detail = [e for e in self.entries if e not in by_name and all(w in f"{e[0]} {e[1]}".lower() for w in words)]
        for text, detail, value in by_name + by_detail:  # commands named so first, then those described so
            item = QListWidgetItem(f"{text}    {detail}" if detail else text)
            item.setData(DATA, value)
            item.setToolTip(detail)
            self.list.addItem(item)
        self.list.setCurrentRow(0)
        self.empty.setVisible(self.list.count() == 0)

    def shown(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def eventFilter(self, obj, event) -> bool:  # noqa: N802
        """Up/Down/PgUp/PgDown in the search box move in the list; Enter picks."""
        if obj is self.search and isinstance(event, QKeyEvent) and event.type() == QKeyEvent.Type.KeyPress:
            if event.key() in (Qt.Key.Key_Up, Qt.Key.Key_Down, Qt.Key.Key_PageUp, Qt.Key.Key_PageDown):
                self.list.keyPressEvent(event)
                return True
            if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
                if self.list.currentItem() is not None:
                    self._activate(self.list.currentItem())
                return True
        return super().eventFilter(obj, event)

    def _activate(self, item: QListWidgetItem) -> None:
        value = item.data(DATA)
        self.accept()
        if self.parentWidget() is not None:  # the keys go back to the window (some window managers leave
            self.parentWidget().activateWindow()  # no window active when a dialog closes)
        self.picked(value)


def collect_actions(window: QMainWindow) -> list[tuple[str, QAction]]:
    """Every command in the window's menus, as ("Menu › Command", action), in menu order."""
    out: list[tuple[str, QAction]] = []

    def walk(menu: QMenu, path: str) -> None:
        for act in menu.actions():
            if act.isSeparator() or not act.isVisible():
                continue
            if act.menu() is not None:
                walk(act.menu(), f"{path} › {plain(act.text())}")
            else:
                out.append((f"{path} › {plain(act.text())}", act))
    for top in window.menuBar().actions():
        if top.menu() is not None:
            walk(top.menu(), plain(top.text()))
    return out


def keys_text(action: QAction) -> str:
    """The action's keys as the user types them: "Ctrl+K, Ctrl+Shift+P"."""
    return ", ".join(k.toString(QKeySequence.SequenceFormat.NativeText) for k in action.shortcuts())


def open_palette(window: QMainWindow) -> QuickPick:
    """The command palette over the window's menu commands; the picked one is triggered."""
    entries = []
    for path, act in collect_actions(window):
        if not act.isEnabled():
            continue
        keys = keys_text(act)
        entries.append((path, f"{keys}  —  {act.statusTip()}" if keys else act.statusTip(), act))
    pick = QuickPick("Command palette", entries, lambda act: act.trigger(), window,
                     "Type a command: new chat, tiles, stop, model…")
    pick.open()
    pick.search.setFocus()
    return pick

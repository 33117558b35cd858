"""Help > Keyboard shortcuts: a table of every menu command with its keys, made from the menus' own
QActions (app.window.command_palette.collect_actions), so it always says what the keys really are."""
from __future__ import annotations

from PySide6.QtWidgets import (
    QDialog, QDialogButtonBox, QHeaderView, QLabel, QMainWindow, QTableWidget, QTableWidgetItem, QVBoxLayout,
)

from app.window.command_palette import collect_actions, keys_text

IN_PANES = (("Enter", "Send the message (in a message box)"),
            ("Shift+Enter", "A new line in the message"),
            ("Esc", "Stop the chat's reply, or cancel an edit (in a chat)"),
            ("F2", "Rename the selected chat (in the chat list)"))


class ShortcutsHelp(QDialog):
    def __init__(self, window: QMainWindow):
        super().__init__(window)
        self.setWindowTitle("Keyboard shortcuts")
        rows = [(path, keys_text(act), act.statusTip()) for path, act in collect_actions(window) if act.shortcuts()]
        rows += [("In a chat", keys, about) for keys, about in IN_PANES]
        self.table = QTableWidget(len(rows), 3)
        self.table.setAccessibleName("Keyboard shortcuts")
        self.table.setHorizontalHeaderLabels(["Command", "Keys", "What it does"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(False)  # one line a command (the whole description in its tooltip)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 8)
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.table.setItem(r, c, item)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Every command is also in the command palette (Ctrl+K)."))
        layout.addWidget(self.table, 1)
        layout.addWidget(buttons)
        self.resize(900, 560)

    def rows(self) -> list[tuple[str, str]]:
        return [(self.table.item(r, 0).text(), self.table.item(r, 1).text()) for r in range(self.table.rowCount())]

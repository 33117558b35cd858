"""The window's menus (File, View, Chat) and its View toolbar.

Chat menu items act on the current chat (the current tab, or the most recently used tile). The View menu
also lists every dock's show/hide toggle, so it is built after the docks.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMainWindow, QMenu

from app.chat.chat_pane import ChatPane
from app.window.chat_area import ChatArea

VIEWS = (("&Tabs", "tabs", 2), ("Tiles: &2", "tiles", 2), ("Tiles: &3", "tiles", 3), ("Tiles: &4", "tiles", 4))


def build_menus(window: QMainWindow, chats: ChatArea, *, new_chat: Callable[[], object],
                export: Callable[[str], object], preferences: Callable[[], object],
                mcp_servers: Callable[[], object] | None = None) -> dict[tuple[str, int], QAction]:
    """Add the menus and toolbar; returns the View actions by (mode, tile count), checked as the view changes."""
    bar = window.menuBar()
    file = bar.addMenu("&File")
    _action(window, file, "&New chat", QKeySequence.StandardKey.New, lambda: new_chat())
    _action(window, file, "Export chat as &Markdown…", None, lambda: export(".md"))
    _action(window, file, "Export chat as &JSON…", None, lambda: export(".json"))
    file.addSeparator()
    _action(window, file, "&Preferences…", QKeySequence.StandardKey.Preferences, preferences)
    file.addSeparator()
    _action(window, file, "&Quit", QKeySequence.StandardKey.Quit, window.close)
    view = bar.addMenu("&View")
    group = QActionGroup(window)
    view_actions = {}
    for label, mode, n in VIEWS:
        act = _action(window, view, label, None,
                      lambda _=False, m=mode, k=n: chats.show_tiles(k) if m == "tiles" else chats.set_view("tabs"))
        act.setCheckable(True)
        group.addAction(act)
        view_actions[(mode, n)] = act
    view_actions[("tabs", 2)].setChecked(True)
    chats.view_changed.connect(lambda mode, n: view_actions[(mode, n)].setChecked(True))
    tools = window.addToolBar("View")
    tools.setObjectName("view-toolbar")
    tools.addAction(file.actions()[0])
    tools.addSeparator()
    for act in view_actions.values():
        tools.addAction(act)
    compare = _action(window, view, "&Compare: one message to every tile", "Ctrl+Shift+K", chats.set_compare)
    compare.setCheckable(True)
    chats.compare_changed.connect(compare.setChecked)
    tools.addAction(compare)
    view.addSeparator()
    for dock in window.findChildren(QDockWidget):
        view.addAction(dock.toggleViewAction())
    chat = bar.addMenu("&Chat")

    def on_current(method) -> Callable[[], None]:
        def act() -> None:
            pane = chats.current_pane()
            if pane is not None:
                method(pane)
        return act

    _action(window, chat, "&Settings…", "Ctrl+,", on_current(ChatPane.open_settings))
    _action(window, chat, "&Regenerate", "Ctrl+R", on_current(ChatPane.regenerate))
    _action(window, chat, "S&top", None, on_current(ChatPane.stop))
    _action(window, chat, "&Copy last reply", "Ctrl+Shift+C", on_current(ChatPane.copy_last))
    chat.addSeparator()
    _action(window, chat, "&Tools and thinking…", None, on_current(ChatPane.open_tools))
    if mcp_servers is not None:
        _action(window, chat, "&MCP servers…", None, mcp_servers)
    return view_actions


def _action(window: QMainWindow, menu: QMenu, text: str, shortcut, slot) -> QAction:
    act = QAction(text, window)
    if shortcut is not None:
        act.setShortcut(QKeySequence(shortcut))
    act.triggered.connect(slot)
    menu.addAction(act)
    return act

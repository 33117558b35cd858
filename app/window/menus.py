"""The window's menus (File, View, Chat, Help) and its View toolbar.

Every command's text, keys and description come from app.window.keymap; the command palette and the
keyboard-shortcuts window list these QActions. Chat menu items act on the current chat (the current tab,
or the most recently used tile). The View menu also shows every dock (Alt+1...), so it is built after the
docks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMainWindow, QMenu

from app.chat.chat_pane import ChatPane
from app.window.chat_area import ChatArea
from app.window.keymap import COMMANDS, DOCK_KEYS, plain

VIEWS = (("view_tabs", "tabs", 2), ("view_tiles_2", "tiles", 2), ("view_tiles_3", "tiles", 3),
         ("view_tiles_4", "tiles", 4))


@dataclass
class WindowCommands:
    """What the window itself does for the menus (the rest is the chat area's)."""
    new_chat: Callable[[], object]
    export: Callable[[str], object]
    preferences: Callable[[], object]
    palette: Callable[[], object]
    shortcuts: Callable[[], object]
    switch_model: Callable[[], object]
    mcp_servers: Callable[[], object] | None = None
    panel_actions: tuple[QAction, ...] = ()  # the side rails' (app.window.dock_rails), in View > Panels


def build_menus(window: QMainWindow, chats: ChatArea, do: WindowCommands) -> dict[tuple[str, int], QAction]:
    """Add the menus and toolbar; returns the View actions by (mode, tile count), checked as the view changes."""
    bar = window.menuBar()
    file = bar.addMenu("&File")
    new = command(window, file, "new_chat", lambda: do.new_chat())
    command(window, file, "export_md", lambda: do.export(".md"))
    command(window, file, "export_json", lambda: do.export(".json"))
    file.addSeparator()
    command(window, file, "preferences", do.preferences)
    file.addSeparator()
    command(window, file, "quit", window.close)

    view = bar.addMenu("&View")
    group = QActionGroup(window)
    view_actions = {}
    for name, mode, n in VIEWS:
        act = command(window, view, name,
                      lambda _=False, m=mode, k=n: chats.show_tiles(k) if m == "tiles" else chats.set_view("tabs"))
        act.setCheckable(True)
        group.addAction(act)
        view_actions[(mode, n)] = act
    view_actions[("tabs", 2)].setChecked(True)
    chats.view_changed.connect(lambda mode, n: view_actions[(mode, n)].setChecked(True))
    tools = window.addToolBar("View")
    tools.setObjectName("view-toolbar")
    tools.addAction(new)
    tools.addSeparator()
    for act in view_actions.values():
        tools.addAction(act)
    compare = command(window, view, "compare", chats.set_compare)
    compare.setCheckable(True)
    chats.compare_changed.connect(compare.setChecked)
    tools.addAction(compare)
    view.addSeparator()
    command(window, view, "next_pane", lambda: chats.step_pane(1))
    command(window, view, "previous_pane", lambda: chats.step_pane(-1))
    command(window, view, "focus_composer", chats.focus_composer)
    command(window, view, "palette", do.palette)
    view.addSeparator()
    docks = view.addMenu("&Panels")
    for n, dock in enumerate(window.findChildren(QDockWidget)):
        act = QAction(f"Show {dock.windowTitle()}", window)
        act.setStatusTip(f"Show the {dock.windowTitle()} panel and move the keyboard focus into it")
        if n < len(DOCK_KEYS):
            act.setShortcut(QKeySequence(DOCK_KEYS[n]))
        act.triggered.connect(lambda _=False, d=dock: show_dock(d))
        docks.addAction(act)
    docks.addSeparator()
    for dock in window.findChildren(QDockWidget):
        toggle = dock.toggleViewAction()
        toggle.setText(f"{dock.windowTitle()} (shown)")
        toggle.setStatusTip(f"Show or hide the {dock.windowTitle()} panel")
        docks.addAction(toggle)
    if do.panel_actions:
        docks.addSeparator()
        docks.addActions(list(do.panel_actions))

    chat = bar.addMenu("&Chat")

    def on_current(method) -> Callable[[], None]:
        def act() -> None:
            pane = chats.current_pane()
            if pane is not None:
                method(pane)
        return act

    command(window, chat, "send_all", chats.send_to_all)
    command(window, chat, "regenerate", on_current(ChatPane.regenerate))
    command(window, chat, "continue", on_current(ChatPane.continue_reply))
    command(window, chat, "stop", on_current(ChatPane.stop))
    command(window, chat, "stop_all", chats.stop_all)
    command(window, chat, "branch", on_current(ChatPane.branch_last))
    command(window, chat, "copy_last", on_current(ChatPane.copy_last))
    command(window, chat, "pin_document", on_current(ChatPane.pick_document))
    chat.addSeparator()
    command(window, chat, "chat_settings", on_current(ChatPane.open_settings))
    command(window, chat, "tools", on_current(ChatPane.open_tools))
    if do.mcp_servers is not None:
        command(window, chat, "mcp_servers", do.mcp_servers)
    chat.addSeparator()
    command(window, chat, "switch_model", do.switch_model)

    help_menu = bar.addMenu("&Help")
    command(window, help_menu, "shortcuts", do.shortcuts)
    return view_actions


def command(window: QMainWindow, menu: QMenu, name: str, slot) -> QAction:
    """The keymap's command `name` as a QAction in `menu`, its keys working anywhere in the window."""
    spec = COMMANDS[name]
    act = QAction(spec.text, window)
    act.setObjectName(name)
    act.setShortcuts(spec.sequences())
    act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    act.setStatusTip(spec.about)
    act.setToolTip(f"{plain(spec.text)} ({act.shortcut().toString(QKeySequence.SequenceFormat.NativeText)})"
                   if spec.keys else plain(spec.text))
    act.triggered.connect(slot)
    menu.addAction(act)
    return act


def show_dock(dock: QDockWidget) -> None:
    """Show a dock, bring it to the front of its tab column and put the keyboard focus in it."""
    dock.show()
    dock.raise_()
    target = dock.widget()
    if target is not None:
        first = target.nextInFocusChain() if target.focusPolicy() == Qt.FocusPolicy.NoFocus else target
        for _ in range(200):  # the first focusable widget inside the dock
            if first is None or not target.isAncestorOf(first) and first is not target:
                break
            if first.focusPolicy() & Qt.FocusPolicy.TabFocus and first.isVisibleTo(dock) and first.isEnabled():
                first.setFocus(Qt.FocusReason.ShortcutFocusReason)
                return
            first = first.nextInFocusChain()
        dock.setFocus()

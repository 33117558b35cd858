"""The main window: chat list, chat panes as tabs or 2-4 side-by-side tiles, engine panels in docks.

Every open chat has its own ChatSession; all of them send jobs to the one EngineService generator,
so any number of chats stream at once. The dashboard, model and LoRA panels are separate widgets
talking to EngineService through signals. Chats hold a BackendSwitch: the Model panel's "Remote server"
(app.remote_mode) points it at a remote server, and the Server panel (app.server_panel) serves the local
generator to other programs.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import (
    QApplication, QDockWidget, QFileDialog, QLabel, QMainWindow, QSplitter, QStackedWidget, QTabWidget, QVBoxLayout,
    QWidget,
)

from app.chat_list import ChatList
from app.chat_pane import ChatPane, RenderScheduler
from app.backend import BackendSwitch
from app.chat_session import ChatSession, spawn
from app.dashboard import DashboardDock
from app.engine_service import EngineService
from app.export import export_chat
from app.lora_panel import LoraPanel
from app.model_panel import ModelPanel
from app.preferences import Preferences
from app.preferences_dialog import PreferencesDialog
from app.remote_mode import RemoteMode
from app.server_panel import LocalServer, ServerPanel
from app.store import Store
from app.theme import Theme
from engine.contract import DEFAULT_CACHE_TOKENS

class MainWindow(QMainWindow):
    closing = Signal()  # the user closed the window; the app then awaits shutdown()

    def __init__(self, store: Store | None = None, service: EngineService | None = None, *,
                 data_dir: str | Path | None = None, load_request: dict | None = None):
        super().__init__()
        self.setWindowTitle("pagedeck")
        self.resize(1400, 900)
        self.store = store if store is not None else Store.open(data_dir)
        self.service = service if service is not None else EngineService(self)
        self.backend = BackendSwitch(self.service)  # what the chats talk to: local or a remote server
        self.load_request = load_request or {}
        self.sessions: dict[int, ChatSession] = {}
        self.panes: dict[int, ChatPane] = {}
        self.open_ids: list[int] = []  # tab order
        self.recent: list[int] = []  # most recently used first (tiles show the first tile_count)
        self.mode = "tabs"
        self.tile_count = 2
        self.last_error = ""
        self._load_task: asyncio.Task | None = None
        self.scheduler = RenderScheduler(self)

        self.tabs = QTabWidget()
        self.tabs.setTabsClosable(True)
        self.tabs.setMovable(True)
        self.tabs.tabCloseRequested.connect(lambda i: self.close_chat(self.tabs.widget(i).session.chat_id))
        self.tabs.currentChanged.connect(self._tab_changed)
        self.tiles = QWidget()
        QVBoxLayout(self.tiles).setContentsMargins(0, 0, 0, 0)  # holds one splitter grid at a time
        self.stack = QStackedWidget()
        self.stack.addWidget(self.tabs)
        self.stack.addWidget(self.tiles)
        self.setCentralWidget(self.stack)
        self._parking = QWidget()  # parent of panes that are not shown
        self._parking.hide()

        self.prefs = Preferences()
        self.theme = Theme(self.prefs, self)
        self.theme.changed.connect(self._theme_changed)
        self.theme.apply()
        self.chat_list = ChatList(self.store)
        self.chat_list.new_chat_settings = self.prefs.new_chat_settings
        self.chat_list.open_requested.connect(self.open_chat)
        self.chat_list.renamed.connect(self._renamed)
        self.chat_list.deleted.connect(self._deleting)
        self._dock("Chats", self.chat_list, Qt.DockWidgetArea.LeftDockWidgetArea)

        self.model_status = QLabel("no model")
        self.statusBar().addPermanentWidget(self.model_status)
        self.local_server = self.remote = None
        self._panels()
        self._menus()
        QApplication.instance().focusChanged.connect(self._focus_changed)
        s = self.service
        s.load_progress.connect(lambda f: self.model_status.setText(f"loading… {f * 100:.0f}%"))
        s.loaded.connect(self._loaded)
        s.load_failed.connect(self._error)
        s.lora_failed.connect(self._error)
        if s.info is not None:  # a service that loaded before this window existed
            s.loaded.emit(s.info)

    # --- docks ---------------------------------------------------------------------------------

    def _dock(self, title: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(title)
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

    def _panels(self) -> None:
        s = self.service
        self.dashboard = DashboardDock(self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.dashboard)
        s.metrics.connect(self.dashboard.push)
        self.model_panel = p = ModelPanel(self.store.path.parent / "recent_models.json",
                                          cache_tokens=self.load_request.get("cache_tokens") or DEFAULT_CACHE_TOKENS)
        p.load_requested.connect(self.load_model)
        s.load_progress.connect(p.set_progress)
        s.loaded.connect(p.set_loaded)
        s.load_failed.connect(p.show_error)
        model_dock = self._dock("Model", p, Qt.DockWidgetArea.RightDockWidgetArea)
        self.lora_panel = p = LoraPanel()
        p.apply_requested.connect(lambda pairs: spawn(s.apply_loras(list(pairs)), self._error))
        s.loras_active.connect(p.set_active)
        s.loras_pending.connect(p.set_pending)
        s.lora_failed.connect(p.show_error)
        lora_dock = self._dock("LoRA", p, Qt.DockWidgetArea.RightDockWidgetArea)
        self.tabifyDockWidget(model_dock, lora_dock)
        self._server_panels()

    def _server_panels(self) -> None:
        """The Server panel (serve this generator) and remote mode (chat through another server)."""
        lora = self.lora_panel
        self.local_server = LocalServer(
            self.service, lambda: {a.name: a.path for a in lora.adapters() if not a.problem}, self)
        self.server_panel = ServerPanel(self.local_server)
        server_dock = self._dock("Server", self.server_panel, Qt.DockWidgetArea.RightDockWidgetArea)
        model_dock = next((d for d in self.findChildren(QDockWidget) if d.objectName() == "Model"), None)
        if model_dock is not None:
            self.tabifyDockWidget(model_dock, server_dock)
            model_dock.raise_()
        self.remote = RemoteMode(self)

    def _menus(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        self._action(file, "&New chat", QKeySequence.StandardKey.New, lambda: self.new_chat())
        self._action(file, "Export chat as &Markdown…", None, lambda: self.export_current(".md"))
        self._action(file, "Export chat as &JSON…", None, lambda: self.export_current(".json"))
        file.addSeparator()
        self._action(file, "&Preferences…", QKeySequence.StandardKey.Preferences, self.open_preferences)
        file.addSeparator()
        self._action(file, "&Quit", QKeySequence.StandardKey.Quit, self.close)
        view = bar.addMenu("&View")
        group = QActionGroup(self)
        self.view_actions = {}
        for label, mode, n in (("&Tabs", "tabs", 2), ("Tiles: &2", "tiles", 2), ("Tiles: &3", "tiles", 3), ("Tiles: &4", "tiles", 4)):
            act = self._action(view, label, None, lambda _=False, m=mode, k=n: self.set_view(m, k))
            act.setCheckable(True)
            group.addAction(act)
            self.view_actions[(mode, n)] = act
        self.view_actions[("tabs", 2)].setChecked(True)
        tools = self.addToolBar("View")
        tools.setObjectName("view-toolbar")
        tools.addAction(file.actions()[0])
        tools.addSeparator()
        for act in self.view_actions.values():
            tools.addAction(act)
        view.addSeparator()
        for dock in self.findChildren(QDockWidget):
            view.addAction(dock.toggleViewAction())
        chat = bar.addMenu("&Chat")
        self._action(chat, "&Settings…", "Ctrl+,", lambda: self._current_do(ChatPane.open_settings))
        self._action(chat, "&Regenerate", "Ctrl+R", lambda: self._current_do(ChatPane.regenerate))
        self._action(chat, "S&top", None, lambda: self._current_do(ChatPane.stop))
        self._action(chat, "&Copy last reply", "Ctrl+Shift+C", lambda: self._current_do(ChatPane.copy_last))

    def _action(self, menu, text, shortcut, slot) -> QAction:
        act = QAction(text, self)
        if shortcut is not None:
            act.setShortcut(QKeySequence(shortcut))
        act.triggered.connect(slot)
        menu.addAction(act)
        return act

    def open_preferences(self) -> PreferencesDialog:
        dlg = PreferencesDialog(self.theme, self)
        dlg.open()
        return dlg

    def _theme_changed(self, _dark: bool) -> None:
        for pane in self.panes.values():  # code colours are picked per theme when a transcript is built
            pane.rebuild()

    # --- chats ---------------------------------------------------------------------------------

    def new_chat(self, title: str = "New chat") -> ChatPane:
        chat_id = self.chat_list.new_chat(title)  # emits open_requested -> open_chat
        return self.panes[chat_id]

    def pane(self, chat_id: int) -> ChatPane:
        if chat_id not in self.panes:
            session = ChatSession(self.store, chat_id, self.backend, self)
            session.renamed.connect(lambda _t: self._renamed(chat_id, session.chat.title))
            session.history_changed.connect(self.chat_list.refresh)
            pane = ChatPane(session, self.scheduler, self._parking)
            pane.focused.connect(lambda p: self._touch(p.session.chat_id))
            pane.branched.connect(self._branched)
            self.chat_list.track(session)
            self.sessions[chat_id], self.panes[chat_id] = session, pane
        return self.panes[chat_id]

    def open_chat(self, chat_id: int) -> ChatPane:
        pane = self.pane(chat_id)
        if chat_id not in self.open_ids:
            self.open_ids.append(chat_id)
        self._touch(chat_id)
        self._layout()
        if self.mode == "tabs":
            self.tabs.setCurrentWidget(pane)
        pane.prompt.setFocus()
        return pane

    def _branched(self, chat_id: int) -> None:
        self.chat_list.refresh()
        self.open_chat(chat_id)

    def close_chat(self, chat_id: int) -> None:
        """Close its pane; a running reply keeps streaming (and saving) in the background."""
        if chat_id in self.open_ids:
            self.open_ids.remove(chat_id)
            self.recent = [i for i in self.recent if i != chat_id]
            self._layout()

    def _deleting(self, chat_id: int) -> None:
        self.close_chat(chat_id)
        session, pane = self.sessions.pop(chat_id, None), self.panes.pop(chat_id, None)
        if session is not None and session.task is not None:
            session.task.cancel()  # records it stopped; the chat row goes right after
        if pane is not None:
            self.scheduler.forget(pane)
            pane.deleteLater()

    def _renamed(self, chat_id: int, title: str) -> None:
        pane = self.panes.get(chat_id)
        if pane is not None:
            pane.session.chat = self.store.chat(chat_id)
            pane.update_header()
            i = self.tabs.indexOf(pane)
            if i >= 0:
                self.tabs.setTabText(i, title)
        self.chat_list.refresh()

    def current_pane(self) -> ChatPane | None:
        if self.mode == "tabs":
            return self.tabs.currentWidget()
        return self.panes.get(self.recent[0]) if self.recent else None

    def _current_do(self, method) -> None:
        pane = self.current_pane()
        if pane is not None:
            method(pane)

    def _touch(self, chat_id: int) -> None:
        self.recent = [chat_id] + [i for i in self.recent if i != chat_id]

    def _focus_changed(self, _old: QWidget | None, new: QWidget | None) -> None:
        """Clicking into a tile makes its chat the current one (for menus, export, tile order)."""
        while new is not None and not isinstance(new, ChatPane):
            new = new.parentWidget()
        if new is not None and self.panes.get(new.session.chat_id) is new:
            self._touch(new.session.chat_id)

    def _tab_changed(self, index: int) -> None:
        pane = self.tabs.widget(index)
        if pane is not None and self.mode == "tabs":
            self._touch(pane.session.chat_id)
            self.chat_list.select(pane.session.chat_id)

    # --- layout --------------------------------------------------------------------------------

    def set_view(self, mode: str, tiles: int = 2) -> None:
        if mode not in ("tabs", "tiles") or not 2 <= tiles <= 4:
            raise ValueError(f"view must be 'tabs' or 'tiles' with 2-4 tiles, got {mode!r}, {tiles}")
        self.mode, self.tile_count = mode, tiles
        self.view_actions[(mode, tiles if mode == "tiles" else 2)].setChecked(True)
        self._layout()

    def show_side_by_side(self, panes: list[ChatPane]) -> None:
        """Tile these panes (2-4 of them), leftmost first."""
        for p in reversed(panes):
            self.open_chat(p.session.chat_id)
        self.set_view("tiles", max(2, min(4, len(panes))))

    def visible_panes(self) -> list[ChatPane]:
        return [p for p in self.panes.values() if p.isVisible()]

    def _layout(self) -> None:
        """Put the open panes into tabs or tiles; the others are parked (hidden, still streaming)."""
        current = self.tabs.currentWidget()
        self.tabs.blockSignals(True)
        self.tabs.clear()
        for pane in self.panes.values():
            pane.setParent(self._parking)
        old = self.tiles.layout().takeAt(0)
        if old is not None and old.widget() is not None:
            old.widget().deleteLater()
        if self.mode == "tabs":
            for chat_id in self.open_ids:
                self.tabs.addTab(self.panes[chat_id], self.sessions[chat_id].chat.title)
            if current is not None and self.tabs.indexOf(current) >= 0:
                self.tabs.setCurrentWidget(current)
            self.stack.setCurrentWidget(self.tabs)
        else:
            shown = [i for i in self.open_ids if i in self.recent[: self.tile_count]]
            grid = _grid([self.panes[i] for i in shown])
            self.tiles.layout().addWidget(grid)
            grid.show()  # a layout shows new children of a visible widget only later (queued)
            self.stack.setCurrentWidget(self.tiles)
        self.tabs.blockSignals(False)
        for pane in self.panes.values():
            if pane.parent() is self._parking:
                pane.hide()
            elif self.mode == "tiles":
                pane.show()

    # --- engine --------------------------------------------------------------------------------

    def load_model(self, request: dict | None = None) -> asyncio.Task:
        self._load_task = spawn(self.service.load(request if request is not None else self.load_request), self._error)
        return self._load_task

    async def ready(self) -> bool:
        """Wait for the first model load (started now if nobody started one); True if a model is up."""
        if self._load_task is None and self.service.generator is None:
            self.load_model()
        if self._load_task is not None:
            await asyncio.wait([self._load_task])
        return self.service.generator is not None

    def _loaded(self, info: dict) -> None:
        size = info["memory_bytes"] / 2**20
        weights = " · 4-bit matmuls" if info.get("weights") == "q4" else ""
        self.model_status.setText(f"{info['name']} · {info['device']} {info['dtype']}{weights} · {size:.0f} MiB · "
                                  f"{info['pages']} pages")
        self.statusBar().showMessage(f"Loaded {info['name']} in {info.get('load_seconds', 0):.1f} s", 5000)

    def _error(self, message: str) -> None:
        self.last_error = message
        self.statusBar().showMessage(message, 15000)
        if self.service.info is not None:
            self._loaded(self.service.info)
        else:
            self.model_status.setText("no model")

    def export_current(self, suffix: str) -> Path | None:
        pane = self.current_pane()
        if pane is None:
            return None
        title = pane.session.chat.title
        default = str(Path.home() / f"{''.join(c if c.isalnum() else '_' for c in title)[:40]}{suffix}")
        name, _ = QFileDialog.getSaveFileName(self, "Export chat", default, "Markdown (*.md);;JSON (*.json)")
        if not name:
            return None
        try:
            return export_chat(self.store, pane.session.chat_id, name)
        except (OSError, ValueError) as exc:
            self._error(f"Export failed: {exc}")
            return None

    def closeEvent(self, e) -> None:
        self.closing.emit()
        super().closeEvent(e)

    async def shutdown(self) -> None:
        """Stop every reply (their partial text is saved), close the generator and the store."""
        for session in list(self.sessions.values()):
            await session.stop()
        if self.remote is not None:
            await self.remote.disconnect()
        if self.local_server is not None:
            await self.local_server.stop()
        await self.service.close()
        self.store.close()


def _grid(panes: list[ChatPane]) -> QSplitter:
    """1-3 panes side by side; 4 as a 2x2 grid of splitters (every divider draggable)."""
    if len(panes) == 4:
        outer = QSplitter(Qt.Orientation.Vertical)
        for pair in (panes[:2], panes[2:]):
            outer.addWidget(_grid(pair))
        return outer
    row = QSplitter(Qt.Orientation.Horizontal)
    for p in panes:
        row.addWidget(p)
    return row

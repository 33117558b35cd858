"""The main window: chat list, chat panes as tabs or 2-4 side-by-side tiles, engine panels in docks.

Every open chat has its own ChatSession; all of them send jobs to the one EngineService generator,
so any number of chats stream at once. The dashboard, model and LoRA panels are separate widgets
talking to EngineService through signals. Chats hold a BackendSwitch: the Model panel's "Remote server"
(app.remote.remote_mode) points it at a remote server, and the Server panel (app.panels.server_panel) serves the local
generator to other programs.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtCore import QRect, Qt, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import (
    QApplication, QDockWidget, QFileDialog, QLabel, QMainWindow, QMessageBox, QSizePolicy, QStackedWidget,
    QTabWidget, QVBoxLayout, QWidget,
)

from app.chat.chat_list import ChatList
from app.chat.chat_pane import ChatPane, RenderScheduler
from app.core.backend import BackendSwitch
from app.chat.chat_session import ChatSession
from app.core.tasks import spawn
from app.panels.dashboard import DashboardDock
from app.local.engine_service import EngineService
from app.core.export import export_chat
from app.panels.lora_panel import LoraPanel
from app.panels.model_browser import ModelBrowser
from app.panels.model_panel import ModelPanel
from app.preferences.preferences import Preferences
from app.preferences.preferences_dialog import PreferencesDialog
from app.remote.remote_mode import RemoteMode
from app.panels.server_panel import LocalServer, ServerPanel
from app.core.store import Store
from app.preferences.theme import Theme
from app.window.window_state import STATE_FILE, WindowState
from app.window.window_layout import CENTRAL_MINIMUM, fit_window, grid, scrolled
from engine.contract import DEFAULT_CACHE_TOKENS, model_path_problem


class MainWindow(QMainWindow):
    closing = Signal()  # the user closed the window; the app then awaits shutdown()

    def __init__(self, store: Store | None = None, service: EngineService | None = None, *,
                 data_dir: str | Path | None = None, load_request: dict | None = None,
                 state_path: str | Path | None = None):
        super().__init__()
        self.setWindowTitle("pagedeck")
        self._fitted = False  # the first show fits the window to its screen
        self._restored = False  # a geometry restored from the last session (app.core.state) is kept if it fits
        self.store = store if store is not None else Store.open(data_dir)
        self.service = service if service is not None else EngineService(self)
        self.backend = BackendSwitch(self.service)  # what the chats talk to: local or a remote server
        self.state = WindowState(state_path if state_path is not None else self.store.path.parent / STATE_FILE)
        self.load_request = self._first_request(load_request or {})
        self.load_question: QMessageBox | None = None  # asks before a load stops running replies
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
        # Nothing in a pane (long titles, 4 tiles) may raise the window's minimum size past the screen:
        # the chat area's minimum is fixed here instead of summed from its panes.
        self.stack.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)
        self.stack.setMinimumSize(CENTRAL_MINIMUM)
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
        self._dock("Chats", self.chat_list, Qt.DockWidgetArea.LeftDockWidgetArea, scroll=False)

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
        self._restore_layout()
        if s.info is not None:  # a service that loaded before this window existed
            s.loaded.emit(s.info)

    # --- docks ---------------------------------------------------------------------------------

    def _dock(self, title: str, widget: QWidget, area: Qt.DockWidgetArea, scroll: bool = True) -> QDockWidget:
        """A dock whose panel scrolls when the screen is smaller than the panel would like."""
        dock = QDockWidget(title, self)
        dock.setObjectName(title)
        dock.setWidget(scrolled(widget) if scroll else widget)
        self.addDockWidget(area, dock)
        return dock

    def _panels(self) -> None:
        s = self.service
        self.dashboard = DashboardDock(self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.dashboard)
        s.metrics.connect(self.dashboard.push)
        self.model_panel = p = ModelPanel(self.store.path.parent / "recent_models.json",
                                          cache_tokens=self.load_request.get("cache_tokens") or DEFAULT_CACHE_TOKENS,
                                          browser=ModelBrowser(self.store.path.parent / "model_folders.json"))
        p.load_requested.connect(self.load_model)
        s.load_progress.connect(p.set_progress)
        s.loaded.connect(p.set_loaded)
        s.load_failed.connect(p.show_error)
        model_dock = self._dock("Model", p, Qt.DockWidgetArea.RightDockWidgetArea)
        self.lora_panel = p = LoraPanel()
        p.apply_requested.connect(lambda pairs: spawn(s.apply_loras(list(pairs)), self._error))
        p.load_requested.connect(lambda path: spawn(s.load_adapter(path), self._error))
        p.unload_requested.connect(lambda name: spawn(s.unload_adapter(name), self._error))
        s.loras_active.connect(self._loras_active)
        s.loras_loaded.connect(p.set_loaded)
        s.loras_pending.connect(p.set_pending)
        s.lora_failed.connect(p.show_error)
        s.lora_failed.connect(lambda _msg: p.set_loaded(s.loaded_adapters()))  # a failed load unchecks
        s.metrics.connect(lambda m: p.set_loaded(m["loras_loaded"]) if m["loras_loaded"] != p.loaded() else None)
        lora_dock = self._dock("LoRA", p, Qt.DockWidgetArea.RightDockWidgetArea, scroll=False)  # after RemoteMode
        self.tabifyDockWidget(self.dashboard, model_dock)  # one tabbed column: fits a 720-px screen
        self.tabifyDockWidget(model_dock, lora_dock)
        self._server_panels()
        self.dashboard.raise_()

    def _server_panels(self) -> None:
        """The Server panel (serve this generator) and remote mode (chat through another server)."""
        self.local_server = LocalServer(self.service, self)
        self.server_panel = ServerPanel(self.local_server)
        server_dock = self._dock("Server", self.server_panel, Qt.DockWidgetArea.RightDockWidgetArea)
        self.tabifyDockWidget(self.dock("LoRA"), server_dock)
        self.remote = RemoteMode(self)  # puts the LoRA dock's panel in a stack with the remote server's one
        lora_dock = self.dock("LoRA")
        lora_dock.setWidget(scrolled(lora_dock.widget()))

    def dock(self, name: str) -> QDockWidget:
        return next(d for d in self.findChildren(QDockWidget) if d.objectName() == name)

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
        if self.store.closed:  # a window whose history is closed (after shutdown) has nothing to rebuild
            return
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
            tiles = grid([self.panes[i] for i in shown])
            self.tiles.layout().addWidget(tiles)
            tiles.show()  # a layout shows new children of a visible widget only later (queued)
            self.stack.setCurrentWidget(self.tiles)
        self.tabs.blockSignals(False)
        for pane in self.panes.values():
            if pane.parent() is self._parking:
                pane.hide()
            elif self.mode == "tiles":
                pane.show()

    # --- engine --------------------------------------------------------------------------------

    def load_model(self, request: dict | None = None, when_busy: str | None = None) -> asyncio.Task | None:
        """Load a model. While replies run, first ask (load_question): stop them and load now, load when they
        have finished, or cancel; when_busy ("stop" or "wait") answers in advance. None while asking."""
        request = request if request is not None else self.load_request
        busy = len(self.service.running)
        if busy and when_busy is None:
            self._ask_before_load(request, busy)
            return None
        if when_busy not in (None, "stop", "wait"):
            raise ValueError(f"when_busy must be 'stop' or 'wait', got {when_busy!r}")
        wait = bool(busy) and when_busy == "wait"
        if wait:
            self.statusBar().showMessage(f"The model loads when {_replies(busy)} finished; new replies wait for it")
        self._load_task = spawn(self.service.load(request, wait_for_replies=wait), self._error)
        return self._load_task

    def _ask_before_load(self, request: dict, busy: int) -> None:
        box = self.load_question = QMessageBox(QMessageBox.Icon.Question, "Load model",
                                               f"{_replies(busy).capitalize()} still running.", parent=self)
        box.setInformativeText("Loading another model now stops them (their text so far is kept).")
        stop = box.addButton("Stop replies and load", QMessageBox.ButtonRole.DestructiveRole)
        wait = box.addButton("Load when they finish", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(wait)

        def answered(button) -> None:
            self.load_question = None
            if button is stop or button is wait:
                self.load_model(request, "stop" if button is stop else "wait")
            else:
                self.model_panel.cancel_loading()

        box.buttonClicked.connect(answered)
        box.open()  # window-modal, and the event loop (replies streaming) keeps running

    async def ready(self) -> bool:
        """Wait for the first model load (started now if nobody started one); True if a model is up."""
        if self._load_task is None and self.service.generator is None:
            self.load_model()
        if self._load_task is not None:
            await asyncio.wait([self._load_task])
        return self.service.generator is not None

    def _loaded(self, info: dict) -> None:
        self._show_model()
        if self.service.request is not None:
            self.state.save_last_model(self.service.request)
            self.state.sync()
        self.statusBar().showMessage(f"Loaded {info['name']} in {info.get('load_seconds', 0):.1f} s", 5000)

    def _show_model(self) -> None:
        """The permanent status label: the model running now (a failed load leaves it as it was)."""
        info = self.service.info
        if info is None:
            self.model_status.setText("no model")
            return
        size = info["memory_bytes"] / 2**20
        weights = f" · {info['weights']} weights" if info.get("weights") in ("packed", "q8") else ""
        self.model_status.setText(f"{info['name']} · {info['device']} {info['dtype']}{weights} · {size:.0f} MiB · "
                                  f"{info['pages']} pages")

    def _loras_active(self, names: list[str]) -> None:
        """The LoRA panel shows (label and ticks) the set the engine runs for the chats, e.g. after a reload."""
        self.lora_panel.set_active(names)
        self.lora_panel.set_selection(dict(self.service.chat_loras))
        self.state.save_loras(list(self.service.chat_loras))

    def _error(self, message: str) -> None:
        self.last_error = message
        self._show_model()  # ends "loading… n%"; the message below stays the newest one shown
        self.statusBar().showMessage(message, 15000)

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

    def fit_to(self, available: QRect) -> None:
        """Fit the window (a restored geometry too) to this screen area; see app.window.window_layout."""
        fit_window(self, available, self._restored, [self.dock("Chats"), self.dashboard])

    def showEvent(self, e) -> None:
        if not self._fitted:
            self._fitted = True
            screen = self.screen() or QApplication.primaryScreen()
            if screen is not None:
                self.fit_to(screen.availableGeometry())
        super().showEvent(e)

    # --- state across restarts ------------------------------------------------------------------

    def _first_request(self, asked: dict) -> dict:
        """What to load first: the command line's model, else the last session's (if still on disk)."""
        if asked.get("path"):
            return asked
        last = self.state.last_model() or {}
        if last.get("path") and model_path_problem(last["path"]) is not None:
            last = {}
        return {**last, **{k: v for k, v in asked.items() if v is not None}}

    def _restore_layout(self) -> None:
        geometry, docks = self.state.geometry(), self.state.dock_state()
        if geometry is not None:
            self._restored = self.restoreGeometry(geometry)
        if docks is not None:
            self.restoreState(docks)
        self.set_view(*self.state.view())
        options = self.state.model_options()
        if options:
            self.model_panel.set_request(options)
        for folder in self.state.lora_folders():
            if Path(folder).is_dir():
                self.lora_panel.add_folder(folder)

    def save_state(self) -> None:
        self.state.save_layout(self.saveGeometry(), self.saveState(), self.mode, self.tile_count)
        current = self.current_pane()
        self.state.save_chats(self.open_ids, current.session.chat_id if current is not None else None)
        self.state.save_model_options(self.model_panel.request())
        self.state.save_lora_folders(self.lora_panel.folders())
        self.state.sync()

    async def restore_session(self) -> None:
        """Reopen the last session's chats, load its model (or the one asked for), re-apply its LoRA set."""
        ids, current = self.state.chats()
        loras = self.state.loras()  # read before the load below saves the new generator's (empty) set
        known = {c.id for c in self.store.chats()}
        for chat_id in (i for i in ids if i in known):
            self.open_chat(chat_id)
        if current in self.open_ids:
            self.open_chat(current)
        if not self.open_ids:
            chats = self.store.chats()
            if chats:
                self.open_chat(chats[0].id)
            else:
                self.new_chat()
        if await self.ready() and loras:
            await self.service.apply_loras(loras, failed="the last session's LoRA set was not applied")

    def closeEvent(self, e) -> None:
        self.save_state()
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


def _replies(n: int) -> str:
    return f"{n} repl{'y is' if n == 1 else 'ies are'}"

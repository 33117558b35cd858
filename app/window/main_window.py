"""The main window: chat list, chat panes as tabs or 2-4 side-by-side tiles, engine panels in docks.

Every open chat has its own ChatSession; all of them send jobs to the one EngineService generator,
so any number of chats stream at once. The dashboard, model and LoRA panels are separate widgets
talking to EngineService through signals. Chats hold a BackendSwitch: the Model panel's "Remote server"
(app.remote.remote_mode) points it at a remote server, and the Server panel (app.panels.server_panel)
serves the local generator to other programs.

The window is the shell that builds and wires its parts: the chat area (app.window.chat_area), model
loading (app.window.model_loader), the status line (app.window.status), the menus (app.window.menus) and
the session kept across restarts (app.window.window_state).
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QRect, Qt, Signal
from PySide6.QtWidgets import (
    QApplication, QDockWidget, QFileDialog, QMainWindow, QStackedWidget, QTabBar, QWidget,
)

from app.batch.batch_view import BatchView
from app.chat.chat_list import ChatList
from app.chat.chat_pane import ChatPane
from app.agent.tool_hub import ToolHub
from app.core.backend import BackendSwitch
from app.core.export import export_chat
from app.core.store import Store
from app.core.store_open import open_history
from app.core.tasks import spawn
from app.discover.discover_view import DiscoverView
from app.local.engine_service import EngineService
from app.local.local_server import LocalServer
from app.local.status_file import StatusFile
from app.panels.dashboard import DashboardDock
from app.panels.dashboard_feed import DashboardFeed
from app.panels.lora_panel import LoraPanel
from app.panels.mcp_dialog import McpServersDialog
from app.panels.model_browser import ModelBrowser
from app.panels.model_panel import ModelPanel
from app.panels.prompt_format import PromptFormatBox
from app.panels.server_panel import ServerPanel
from app.preferences.preferences import Preferences
from app.preferences.preferences_dialog import PreferencesDialog
from app.preferences.theme import Theme
from app.remote.remote_mode import RemoteHandles, RemoteMode
from app.window.chat_area import ChatArea
from app.window.accessibility import name_widgets
from app.window.command_palette import QuickPick, open_palette
from app.window.dock_rails import DockRails
from app.window.menus import WindowCommands, build_menus
from app.window.shortcuts_help import ShortcutsHelp
from app.window.model_loader import ModelLoader
from app.window.status import StatusLine
from app.window.store_notice import StoreNotice
from app.window.window_layout import fit_window, scrolled
from app.window.window_state import STATE_FILE, WindowState
from engine.contract import DEFAULT_CACHE_TOKENS


class MainWindow(QMainWindow):
    closing = Signal()  # the user closed the window; the app then awaits shutdown()

    def __init__(self, store: Store | None = None, service: EngineService | None = None, *,
                 data_dir: str | Path | None = None, load_request: dict | None = None,
                 state_path: str | Path | None = None):
        super().__init__()
        self.setWindowTitle("pagedeck")
        self._fitted = False  # the first show fits the window to its screen
        self._restored = False  # a geometry restored from the last session (app.window.window_state) is kept if it fits
        self.instance_lock, notice = None, None
        if store is None:  # this process's history: one instance per folder, a damaged file moved aside
            opened = open_history(data_dir)
            store, self.instance_lock, notice = opened.store, opened.lock, opened.notice
        self.store = store
        self.service = service if service is not None else EngineService(self)
        self.backend = BackendSwitch(self.service)  # what the chats talk to: local or a remote server
        self.state = WindowState(state_path if state_path is not None else self.store.path.parent / STATE_FILE)
        self.status = StatusLine(self.statusBar())
        self.store_notice = StoreNotice(self.store, notice)
        self.statusBar().insertPermanentWidget(0, self.store_notice, 1)
        self.loader = ModelLoader(self.service, self.status, self.state, load_request or {}, self)

        self.prefs = Preferences()
        self.service.chat_format_for = self.prefs.chat_template_for  # each model loads with its chosen format
        self.theme = Theme(self.prefs, self)
        self.theme.apply()
        self.chat_list = ChatList(self.store)
        self.chat_list.new_chat_settings = self.prefs.new_chat_settings
        self.tools = ToolHub()  # the MCP servers in the config folder's mcp.json
        self.chats = ChatArea(self.store, self.backend, self.chat_list, tools=self.tools)
        self.setCentralWidget(self.chats)
        self.theme.changed.connect(self._theme_changed)
        self._dock("Chats", self.chat_list, Qt.DockWidgetArea.LeftDockWidgetArea, scroll=False)

        self.local_server = self.remote = None
        self._panels()
        # what this window holds, for `pagedeck ps` (only the process that owns the data folder writes it)
        self.status_file = (StatusFile(self.store.path.parent, self.service, self.local_server, self)
                            if self.instance_lock is not None else None)
        self.rails = DockRails(self, self.state)  # side panels as icon rails when the window is narrow
        self.view_actions = build_menus(self, self.chats, WindowCommands(
            new_chat=self.new_chat, export=self.export_current, preferences=self.open_preferences,
            palette=self.open_palette, shortcuts=self.open_shortcuts, switch_model=self.switch_model,
            mcp_servers=self.open_mcp_servers, panel_actions=tuple(self.rails.actions)))
        name_widgets(self)
        self._restore_layout()
        self.rails.start()
        s = self.service
        if s.info is not None:  # a service that loaded before this window existed
            s.loaded.emit(s.info)

    # --- docks ---------------------------------------------------------------------------------

    def _dock(self, title: str, widget: QWidget, area: Qt.DockWidgetArea, scroll: bool = True) -> QDockWidget:
        """A dock whose panel scrolls when the screen is smaller than the panel would like."""
        dock = QDockWidget(title, self)
        dock.setObjectName(title)
        dock.setWidget(scrolled(widget) if scroll else widget)
        dock.widget().setAccessibleName(f"{title} panel")
        self.addDockWidget(area, dock)
        return dock

    def _panels(self) -> None:
        s, error = self.service, self.loader.error
        self.dashboard = DashboardDock(self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.dashboard)
        # compare mode: the picker lists the models beside the main one, and the dashboard follows the chosen one
        feed = DashboardFeed(self.dashboard, s.metrics, models=s.models_changed, choose=s.show_metrics,
                             listing=s.models)
        self.chats.compare.service = s
        s.models_changed.connect(self.chats.compare.refresh_models)
        self.model_panel = p = ModelPanel(self.store.path.parent / "recent_models.json",
                                          cache_tokens=self.loader.load_request.get("cache_tokens") or DEFAULT_CACHE_TOKENS,
                                          browser=ModelBrowser(self.store.path.parent / "model_folders.json"))
        p.load_requested.connect(self.loader.load_model)
        self.loader.cancelled.connect(p.cancel_loading)
        s.load_progress.connect(p.set_progress)
        s.load_stage.connect(p.show_stage)
        s.load_report.connect(p.show_load_report)
        s.loaded.connect(p.set_loaded)
        s.load_failed.connect(p.show_error)
        self.prompt_format = PromptFormatBox()
        p.add_section(self.prompt_format)
        s.loaded.connect(lambda _info: self._format_changed(s.chat_format_info()))
        s.chat_format_changed.connect(self._format_changed)
        self.prompt_format.chosen.connect(self.choose_format)
        model_dock = self._dock("Model", p, Qt.DockWidgetArea.RightDockWidgetArea)
        self.lora_panel = p = LoraPanel()
        p.apply_requested.connect(lambda pairs: spawn(s.apply_loras(list(pairs)), error))
        p.load_requested.connect(lambda path: spawn(s.load_adapter(path), error))
        p.unload_requested.connect(lambda name: spawn(s.unload_adapter(name), error))
        s.loras_active.connect(self._loras_active)
        s.loras_loaded.connect(p.set_loaded)
        s.loras_pending.connect(p.set_pending)
        s.lora_failed.connect(p.show_error)
        s.lora_failed.connect(lambda _msg: p.set_loaded(s.loaded_adapters()))  # a failed load unchecks
        s.metrics.connect(lambda m: p.set_loaded(m["loras_loaded"]) if m["loras_loaded"] != p.loaded() else None)
        loras = QStackedWidget()  # the local panel, or the remote server's while connected
        loras.addWidget(p)
        lora_dock = self._dock("LoRA", loras, Qt.DockWidgetArea.RightDockWidgetArea)
        self.tabifyDockWidget(self.dashboard, model_dock)  # one tabbed column: fits a 720-px screen
        self.tabifyDockWidget(model_dock, lora_dock)
        self.discover = DiscoverView()  # find and download models from the Hugging Face Hub
        self.discover.load_requested.connect(self._load_downloaded)
        self.discover.downloaded.connect(lambda _path: self.model_panel.browser.scan())
        self.tabifyDockWidget(model_dock, self._dock("Discover", self.discover, Qt.DockWidgetArea.RightDockWidgetArea))

        self.local_server = LocalServer(s, self)  # serve this generator to other programs
        self.server_panel = ServerPanel(self.local_server)
        server_dock = self._dock("Server", self.server_panel, Qt.DockWidgetArea.RightDockWidgetArea)
        self.tabifyDockWidget(lora_dock, server_dock)
        self.batch_view = BatchView(self.store, self.backend, self.prefs.presets())  # a file of inputs as jobs
        self.tabifyDockWidget(server_dock, self._dock("Batch", self.batch_view, Qt.DockWidgetArea.RightDockWidgetArea))
        self.remote = RemoteMode(RemoteHandles(  # chat through another server
            chats=self.backend, local=s, dashboard=feed, message=self.status.message,
            show_server_loras=lambda on: loras.setCurrentIndex(1 if on else 0)), self)
        self.model_panel.add_section(self.remote.box)
        loras.addWidget(self.remote.lora_panel)
        self.remote.changed.connect(lambda info: self.loader.back_to_local() if info is None
                                    else self.status.show_remote(info))
        self.dashboard.raise_()

    def _load_downloaded(self, path: str) -> None:
        """Discover's Load: the Model tab loads the download with its own options, showing its progress."""
        self.model_panel.path_edit.setText(path)
        self.model_panel.request_load()
        self.dock("Model").raise_()

    def dock(self, name: str) -> QDockWidget:
        return next(d for d in self.findChildren(QDockWidget) if d.objectName() == name)

    def open_preferences(self) -> PreferencesDialog:
        dlg = PreferencesDialog(self.theme, self)
        dlg.open()
        return dlg

    def _theme_changed(self, _dark: bool) -> None:
        if self.store.closed:  # a window whose history is closed (after shutdown) has nothing to rebuild
            return
        for pane in self.chats.panes.values():  # code colours are picked per theme when a transcript is built
            pane.rebuild()

    def choose_format(self, choice: str) -> None:
        """Send the running model's chats in another prompt format, and remember it for that model."""
        try:
            self.service.set_chat_format(choice)
        except (ValueError, RuntimeError) as exc:
            self.prompt_format.show_error(str(exc))
            return
        self.prefs.set_chat_template_for((self.service.request or {}).get("path"), choice)

    def _format_changed(self, info: dict | None) -> None:
        """A model loaded or its prompt format changed: every pane's format, start page and context meter (whose
        limit a pane opened before the load could not know)."""
        self.prompt_format.show_format(info)
        for pane in self.chats.panes.values():
            pane.update_meter()

    def _loras_active(self, names: list[str]) -> None:
        """The LoRA panel shows (label and ticks) the set the engine runs for the chats, e.g. after a reload."""
        self.lora_panel.set_active(names)
        self.lora_panel.set_selection(dict(self.service.chat_loras))
        self.state.save_loras(list(self.service.chat_loras))

    # --- chats ---------------------------------------------------------------------------------

    def new_chat(self, title: str = "New chat") -> ChatPane:
        chat_id = self.chat_list.new_chat(title)  # emits open_requested -> ChatArea.open_chat
        return self.chats.panes[chat_id]

    def open_palette(self) -> QuickPick:
        self.palette = open_palette(self)
        return self.palette

    def open_shortcuts(self) -> ShortcutsHelp:
        self.shortcuts_help = ShortcutsHelp(self)
        self.shortcuts_help.show()
        return self.shortcuts_help

    def switch_model(self) -> QuickPick:
        """Pick a recent model (or the default one) and load it, as the Model tab's Load does."""
        panel = self.model_panel
        entries = [(Path(path).name, path, path) for path in panel.recent.items]
        entries.append(("Default model", "the embedded default model", ""))

        def load(path: str) -> None:
            panel.path_edit.setText(path)
            panel.request_load()
        self.model_pick = QuickPick("Switch model", entries, load, self, "Type part of a model's name or path…")
        self.model_pick.open()
        self.model_pick.search.setFocus()
        return self.model_pick

    def open_mcp_servers(self) -> McpServersDialog:
        dlg = McpServersDialog(self.tools, self)
        dlg.open()
        self.mcp_dialog = dlg
        return dlg

    def export_current(self, suffix: str) -> Path | None:
        pane = self.chats.current_pane()
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
            self.loader.error(f"Export failed: {exc}")
            return None

    # --- screen ----------------------------------------------------------------------------------

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
        for bar in self.findChildren(QTabBar):  # the dock columns' tabs (made by the layout once docks are tabbed):
            if bar.parent() is self and not bar.styleSheet():  # compact, so five titles show whole in ~300 px
                bar.setStyleSheet("QTabBar::tab { padding: 3px 5px; }")
                bar.setElideMode(Qt.TextElideMode.ElideNone)  # narrower (large fonts): whole titles, scrolled

    # --- state across restarts ------------------------------------------------------------------

    def _restore_layout(self) -> None:
        self._restore_placement()
        docks = self.state.dock_state()
        if docks is not None:
            self.restoreState(docks)
        self.chats.set_view(*self.state.view())
        options = self.state.model_options()
        if options:
            self.model_panel.set_request(options)
        for folder in self.state.lora_folders():
            if Path(folder).is_dir():
                self.lora_panel.add_folder(folder)

    def _restore_placement(self) -> None:
        """Put the window where it was: its frame's corner and its client size, as saved.

        Not QWidget.restoreGeometry: before the window is shown it guesses a title bar (about 25 px) above the
        saved client area, so on a screen without a window manager's frame a window saved at the top came back
        that much lower, its bottom off the screen. fit_window then keeps the placement on today's screen."""
        placement = self.state.placement()
        if placement is None:
            return
        x, y, width, height, maximized = placement
        self.resize(width, height)
        self.move(x, y)
        self._restored = True
        if maximized:
            self.setWindowState(self.windowState() | Qt.WindowState.WindowMaximized)

    def save_state(self) -> None:
        normal = self.normalGeometry() if self.isMaximized() else None  # the size it comes back to
        x, y = (normal.x(), normal.y()) if normal is not None else (self.x(), self.y())
        size = normal.size() if normal is not None else self.size()
        self.state.save_placement(x, y, size.width(), size.height(), self.isMaximized())
        self.state.save_layout(self.saveState(), self.chats.mode, self.chats.tile_count)
        self.rails.save()
        current = self.chats.current_pane()
        self.state.save_chats(self.chats.open_ids, current.session.chat_id if current is not None else None)
        self.state.save_model_options(self.model_panel.request())
        self.state.save_lora_folders(self.lora_panel.folders())
        self.state.sync()

    async def restore_session(self) -> None:
        """Reopen the last session's chats, load its model (or the one asked for), re-apply its LoRA set."""
        ids, current = self.state.chats()
        loras = self.state.loras()  # read before the load below saves the new generator's (empty) set
        known = {c.id for c in self.store.chats()}
        for chat_id in (i for i in ids if i in known):
            self.chats.open_chat(chat_id)
        if current in self.chats.open_ids:
            self.chats.open_chat(current)
        if not self.chats.open_ids:
            chats = self.store.chats()
            if chats:
                self.chats.open_chat(chats[0].id)
            else:
                self.new_chat()
        if await self.loader.ready() and loras:
            await self.service.apply_loras(loras, failed="the last session's LoRA set was not applied")

    def closeEvent(self, e) -> None:
        self.save_state()
        self.closing.emit()
        super().closeEvent(e)

    async def shutdown(self) -> None:
        """Stop every reply (their partial text is saved), close the generator and the store."""
        if self.status_file is not None:
            self.status_file.remove()
        for session in list(self.chats.sessions.values()):
            await session.stop()
        if self.remote is not None:
            await self.remote.disconnect()
        if self.local_server is not None:
            await self.local_server.stop()
        await self.service.close()
        await self.tools.close()
        self.store.close()
        if self.instance_lock is not None:
            self.instance_lock.release()

"""The window's central area: every open chat's pane, as tabs or as 2-4 side-by-side tiles.

Each chat pane has its own ChatSession, created on first open and kept until the chat is deleted: a pane
that is closed, or not among the tiles shown, is parked (hidden) and its reply keeps streaming and saving.
Tiles show the most recently used chats, so clicking into one (or picking a tab) makes it the current one.
Compare mode (app.window.compare_bar) shows the tiles with a bar under them that sends one message to
every ticked tile.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QApplication, QSizePolicy, QStackedWidget, QTabWidget, QVBoxLayout, QWidget

from app.chat.chat_list import ChatList
from app.chat.chat_pane import ChatPane, RenderScheduler
from app.chat.chat_session import ChatSession
from app.agent.tool_hub import ToolHub
from app.core.backend import Backend
from app.core.store import Store
from app.window.compare_bar import CompareBar
from app.window.window_layout import CENTRAL_MINIMUM, grid, tiles_width

class ChatArea(QStackedWidget):
    """Open chats' panes in tabs or tiles; owns every pane and session the window has opened."""

    view_changed = Signal(str, int)  # mode ("tabs" or "tiles"), tile count
    compare_changed = Signal(bool)

    def __init__(self, store: Store, backend: Backend, chat_list: ChatList, parent: QWidget | None = None,
                 tools: ToolHub | None = None):
        super().__init__(parent)
        self.store, self.backend, self.chat_list = store, backend, chat_list
        self.tools = tools  # the MCP tools every chat may be given
        self.sessions: dict[int, ChatSession] = {}
        self.panes: dict[int, ChatPane] = {}
        self.open_ids: list[int] = []  # tab order
        self.recent: list[int] = []  # most recently used first (tiles show the first tile_count)
        self.mode = "tabs"
        self.tile_count = 2
        self.scheduler = RenderScheduler(self)

        self.tabs = QTabWidget()
        self.tabs.setTabsClosable(True)
        self.tabs.setMovable(True)
        self.tabs.setAccessibleName("Open chats")
        self.tabs.tabBar().setAccessibleName("Open chats")
        self.tabs.tabCloseRequested.connect(lambda i: self.close_chat(self.tabs.widget(i).session.chat_id))
        self.tabs.currentChanged.connect(self._tab_changed)
        self.tiles = QWidget()
        QVBoxLayout(self.tiles).setContentsMargins(0, 0, 0, 0)  # holds one splitter grid at a time
        self.compare = CompareBar(self)  # under the grid, in compare mode
        self.compare.hide()
        self.tiles.layout().addWidget(self.compare)
        self.addWidget(self.tabs)
        self.addWidget(self.tiles)
        # Nothing in a pane (long titles, 4 tiles) may raise the window's minimum size past the screen:
        # the chat area's minimum is fixed here instead of summed from its panes.
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)
        self.setMinimumSize(CENTRAL_MINIMUM)
        self.parking = QWidget()  # parent of panes that are not shown
        self.parking.hide()
        chat_list.open_requested.connect(self.open_chat)
        chat_list.renamed.connect(self.renamed)
        chat_list.deleted.connect(self._deleting)
        QApplication.instance().focusChanged.connect(self._focus_changed)

    # --- chats ---------------------------------------------------------------------------------

    def pane(self, chat_id: int) -> ChatPane:
        if chat_id not in self.panes:
            session = ChatSession(self.store, chat_id, self.backend, self, tools=self.tools)
            session.renamed.connect(lambda _t: self.renamed(chat_id, session.chat.title))
            session.history_changed.connect(self.chat_list.refresh)
            pane = ChatPane(session, self.scheduler, self.parking)
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
            # the session goes once its last reply recorded its end (a child of this area that nothing else
            # deletes: it kept the chat's messages and, through its signals, the pane's Python side)
            session.task.add_done_callback(lambda _t: session.deleteLater())
        elif session is not None:
            session.deleteLater()
        if pane is not None:
            self.scheduler.forget(pane)
            pane.deleteLater()

    def renamed(self, chat_id: int, title: str) -> None:
        """A chat's title changed (in its pane or the chat list): its header, tab and list row follow."""
        pane = self.panes.get(chat_id)
        if pane is not None:
            pane.session.chat = self.store.chat(chat_id)
            pane.update_header()
            i = self.tabs.indexOf(pane)
            if i >= 0:
                self.tabs.setTabText(i, title)
        self.compare.rename(chat_id, title)
        self.chat_list.refresh()

    def current_pane(self) -> ChatPane | None:
        if self.mode == "tabs":
            return self.tabs.currentWidget()
        return self.panes.get(self.recent[0]) if self.recent else None

    def shown_panes(self) -> list[ChatPane]:
        """The panes the user can reach now: the tiles, or every tab, in their order."""
        return self.tiled() if self.mode == "tiles" else [self.panes[i] for i in self.open_ids]

    def step_pane(self, step: int) -> ChatPane | None:
        """Go to the next (1) or previous (-1) tab or tile, round the end; its message box gets the focus."""
        panes = self.shown_panes()
        if not panes:
            return None
        current = self.current_pane()
        i = panes.index(current) if current in panes else -step
        pane = panes[(i + step) % len(panes)]
        self._touch(pane.session.chat_id)
        if self.mode == "tabs":
            self.tabs.setCurrentWidget(pane)
        pane.prompt.setFocus(Qt.FocusReason.ShortcutFocusReason)
        return pane

    def focus_composer(self) -> None:
        """The cursor into the current chat's message box (the compare bar's while it is shown)."""
        if self.compare.isVisibleTo(self.tiles) and self.mode == "tiles" and self.compare.prompt.hasFocus():
            pane = self.current_pane()  # pressed again in the bar: on to the current pane
        elif self.compare.isVisibleTo(self.tiles) and self.mode == "tiles":
            self.compare.prompt.setFocus(Qt.FocusReason.ShortcutFocusReason)
            return
        else:
            pane = self.current_pane()
        if pane is not None:
            pane.prompt.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def send_to_all(self) -> list[ChatPane]:
        """Send the message being typed (in the compare bar, else in the current pane) to every pane shown:
        the ticked tiles in compare mode, else every tile (every tab in tab view); returns them."""
        compare = self.mode == "tiles" and self.compare.isVisibleTo(self.tiles)
        source = self.compare.prompt if compare else getattr(self.current_pane(), "prompt", None)
        if source is None or not source.toPlainText().strip():
            return []
        text = source.toPlainText()
        source.clear()
        return self.compare.send(text, None if compare else self.shown_panes())

    def stop_all(self) -> None:
        """Stop every chat's reply (open or not); the queued messages stay queued."""
        for chat_id, session in self.sessions.items():
            if session.running and chat_id in self.panes:
                self.panes[chat_id].stop()

    def _touch(self, chat_id: int) -> None:
        self.recent = [chat_id] + [i for i in self.recent if i != chat_id]
        self.rank_replies()

    def rank_replies(self) -> None:
        """The backend ranks the current chat's reply first, and the panes compared beside it as extras
        (app.core.priorities); called again when the order changes, so running replies follow it."""
        focus = getattr(self.backend, "focus_chat", None)
        if focus is not None and self.recent:
            focus(self.recent[0], [p.session.chat_id for p in self.compare.panes])

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
        self.view_changed.emit(mode, tiles if mode == "tiles" else 2)
        self._layout()

    def show_tiles(self, tiles: int) -> None:
        """The View menu's "Tiles: N": N chats side by side, opening new chats where fewer than N are open
        (N tiles over one chat would show one pane and leave the user to make the others)."""
        self.set_view("tiles", tiles)
        while len(self.open_ids) < tiles:
            self.chat_list.new_chat()  # emits open_requested -> open_chat
        self.focus_composer()

    def set_compare(self, on: bool) -> None:
        """Compare mode: the tiles (the open chats, up to 4) with the compare bar under them."""
        if on and self.mode != "tiles":
            self.set_view("tiles", max(2, min(4, len(self.open_ids))))
        self.compare.setVisible(on)
        self.compare.set_panes(self.tiled() if on else [])
        self.rank_replies()
        self.compare_changed.emit(on)

    def tiled(self) -> list[ChatPane]:
        """The panes shown as tiles now, in their order."""
        return [self.panes[i] for i in self.open_ids if i in self.recent[: self.tile_count]] if self.mode == "tiles" else []

    def show_side_by_side(self, panes: list[ChatPane]) -> None:
        """Tile these panes (2-4 of them), leftmost first."""
        for p in reversed(panes):
            self.open_chat(p.session.chat_id)
        self.set_view("tiles", max(2, min(4, len(panes))))

    def _layout(self) -> None:
        """Put the open panes into tabs or tiles; the others are parked (hidden, still streaming)."""
        current = self.tabs.currentWidget()
        self.tabs.blockSignals(True)
        self.tabs.clear()
        for pane in self.panes.values():
            pane.setParent(self.parking)
        old = self.tiles.layout().itemAt(0)
        if old is not None and old.widget() is not None and old.widget() is not self.compare:
            self.tiles.layout().takeAt(0)
            old.widget().deleteLater()
        if self.mode == "tabs":
            for chat_id in self.open_ids:
                self.tabs.addTab(self.panes[chat_id], self.sessions[chat_id].chat.title)
            if current is not None and self.tabs.indexOf(current) >= 0:
                self.tabs.setCurrentWidget(current)
            self.setMinimumWidth(CENTRAL_MINIMUM.width())
            self.setCurrentWidget(self.tabs)
        else:
            shown = self.tiled()
            tiles = grid(shown)
            self.setMinimumWidth(max(CENTRAL_MINIMUM.width(), tiles_width(len(shown))))
            self.tiles.layout().insertWidget(0, tiles, 1)
            tiles.show()  # a layout shows new children of a visible widget only later (queued)
            self.setCurrentWidget(self.tiles)
        self.tabs.blockSignals(False)
        if self.compare.isVisibleTo(self.tiles):
            if self.mode == "tiles":
                self.compare.set_panes(self.tiled())
            else:
                self.set_compare(False)
        for pane in self.panes.values():
            if pane.parent() is self.parking:
                pane.hide()
            elif self.mode == "tiles":
                pane.show()

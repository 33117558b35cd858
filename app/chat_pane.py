"""A chat pane: transcript, prompt box and reply controls over one ChatSession.

Repaints are paced by one RenderScheduler for all panes: a streaming pane re-renders at most
MAX_RENDER_HZ (less often if its renders get slow), hidden panes not at all (they catch up when shown),
and a tick stops rendering once it has spent its time budget, so eight streaming panes never stall the
UI thread in one go.
"""
from __future__ import annotations

import time

from PySide6.QtCore import QObject, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QGuiApplication, QKeyEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QTextBrowser, QVBoxLayout, QWidget,
)

from app.chat_session import ChatSession, spawn
from app.formatting import stats_text
from app.transcript import Transcript
from app.settings_dialog import SettingsDialog

MAX_RENDER_HZ = 20
TICK_MS = 15
TICK_BUDGET_S = 0.010
RENDER_SHARE_LIMIT = 10  # a pane waits at least 10x its last render time: rendering stays <= ~10% of the thread


class RenderScheduler(QObject):
    """Renders dirty panes, the longest-waiting first, within a per-tick time budget."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._dirty: dict["ChatPane", float] = {}  # pane -> when it became dirty
        self._last: dict["ChatPane", float] = {}
        self._cost: dict["ChatPane", float] = {}  # last render's duration: slow panes render less often
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._tick)

    def mark(self, pane: "ChatPane") -> None:
        self._dirty.setdefault(pane, time.perf_counter())
        if not self._timer.isActive():
            self._timer.start()

    def forget(self, pane: "ChatPane") -> None:
        self._dirty.pop(pane, None)
        self._last.pop(pane, None)
        self._cost.pop(pane, None)

    def _tick(self) -> None:
        start = now = time.perf_counter()
        for pane in sorted(self._dirty, key=self._dirty.get):
            if not pane.isVisible():
                continue  # rendered on show
            interval = max(1.0 / MAX_RENDER_HZ, RENDER_SHARE_LIMIT * self._cost.get(pane, 0.0))
            if now - self._last.get(pane, 0.0) < interval:
                continue
            del self._dirty[pane]
            self._last[pane] = now
            pane.render_stream()
            self._cost[pane] = time.perf_counter() - now
            now = time.perf_counter()
            if now - start > TICK_BUDGET_S:
                break
        if not any(p.isVisible() for p in self._dirty):
            self._timer.stop()


class PromptEdit(QPlainTextEdit):
    """Enter sends, Shift+Enter inserts a newline."""

    submitted = Signal()

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not e.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(e)


class ChatPane(QWidget):
    focused = Signal(object)  # self, when the user interacts with it (tile view tracks the latest)

    def __init__(self, session: ChatSession, scheduler: RenderScheduler, parent: QWidget | None = None):
        super().__init__(parent)
        self.session = session
        self.scheduler = scheduler
        self.editing: int | None = None  # id of the user message being edited

        self.title = QLabel()
        self.title.setStyleSheet("font-weight: bold")
        self.state = QLabel()
        self.state.setStyleSheet("color: gray")
        self.settings_btn = QPushButton("Settings…")
        self.regen_btn = QPushButton("Regenerate")
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setToolTip("Stop the reply (Esc)")
        self.copy_btn = QPushButton("Copy")
        self.copy_btn.setToolTip("Copy the last reply")
        head = QHBoxLayout()
        head.addWidget(self.title, 1)
        head.addWidget(self.state)
        for b in (self.settings_btn, self.regen_btn, self.stop_btn, self.copy_btn):
            b.setAutoDefault(False)
            head.addWidget(b)

        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self.view.anchorClicked.connect(self._anchor)
        self.transcript = Transcript(self.view.document())

        self.banner = QLabel()
        self.banner.setStyleSheet("background: #fff3cd; color: #664d03; padding: 3px")
        self.banner.hide()
        self.error = QLabel()
        self.error.setStyleSheet("color: #c0392b")
        self.error.setWordWrap(True)
        self.error.hide()
        self.prompt = PromptEdit()
        self.prompt.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
        self.prompt.setMaximumHeight(90)
        self.send_btn = QPushButton("Send")
        row = QHBoxLayout()
        row.addWidget(self.prompt, 1)
        row.addWidget(self.send_btn)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(head)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.banner)
        layout.addWidget(self.error)
        layout.addLayout(row)

        self.prompt.submitted.connect(self.submit)
        self.send_btn.clicked.connect(self.submit)
        self.stop_btn.clicked.connect(self.stop)
        self.regen_btn.clicked.connect(self.regenerate)
        self.copy_btn.clicked.connect(self.copy_last)
        self.settings_btn.clicked.connect(self.open_settings)
        esc = QShortcut(QKeySequence(Qt.Key.Key_Escape), self, context=Qt.ShortcutContext.WidgetWithChildrenShortcut)
        esc.activated.connect(self.escape)

        session.history_changed.connect(self.rebuild)
        session.reply_changed.connect(lambda _id: self.scheduler.mark(self))
        session.reply_finished.connect(self._finished)
        session.renamed.connect(lambda _t: self.update_header())
        self.rebuild()

    # --- user actions --------------------------------------------------------------------------

    def submit(self) -> None:
        text = self.prompt.toPlainText()
        if not text.strip():
            return
        self.focused.emit(self)
        self._show_error("")
        if self.editing is not None:
            message_id, self.editing = self.editing, None
            self.banner.hide()
            self.prompt.clear()
            spawn(self.session.edit(message_id, text), self._show_error)
            return
        if self.session.running:
            self._show_error("This chat is still replying: stop it (Esc) or wait.")
            return
        self.prompt.clear()
        try:
            self.session.send(text)
        except Exception as exc:  # noqa: BLE001
            self._show_error(str(exc))

    def send(self, text: str) -> None:
        """Send `text` as if typed into the prompt box and Enter pressed."""
        self.prompt.setPlainText(text)
        self.submit()

    def stop(self) -> None:
        spawn(self.session.stop(), self._show_error)

    def escape(self) -> None:
        if self.editing is not None:
            self.editing = None
            self.banner.hide()
            self.prompt.clear()
        else:
            self.stop()

    def regenerate(self) -> None:
        self._show_error("")
        spawn(self.session.regenerate(), self._show_error)

    def copy_last(self) -> None:
        replies = [m for m in self.session.messages if m.role == "assistant"]
        if replies:
            self._copy(replies[-1].id)

    def open_settings(self) -> None:
        dlg = SettingsDialog(self.session.settings, f"Settings — {self.session.chat.title}", self)
        if dlg.exec() == QDialog.DialogCode.Accepted:
            self.session.set_settings(dlg.settings())

    def start_edit(self, message_id: int) -> None:
        msg = next((m for m in self.session.messages if m.id == message_id), None)
        if msg is None or msg.role != "user":
            return
        self.editing = message_id
        self.prompt.setPlainText(msg.content)
        self.prompt.setFocus()
        self.banner.setText("Editing a message: sending replaces it and drops everything after it (Esc cancels).")
        self.banner.show()

    # --- rendering -----------------------------------------------------------------------------

    def rebuild(self) -> None:
        """Whole transcript from the session's messages (after send/edit/regenerate/load)."""
        self.transcript.clear()
        msgs = self.session.messages
        last_reply = max((m.id for m in msgs if m.role == "assistant"), default=None)
        for m in msgs:
            live = self.session.live(m.id)
            if live is not None:
                self.transcript.begin_stream(m, self._actions(m, last_reply))
                self.transcript.update_stream(*live)
            else:
                self.transcript.append(m, self._actions(m, last_reply), m.stats)
        self.update_header()
        self._scroll_to_end()

    def render_stream(self) -> None:
        """Called by the scheduler: bring the streaming reply's tail and stats up to date."""
        sid = self.transcript.streaming_id
        live = self.session.live(sid) if sid is not None else None
        if live is None:
            return
        bar = self.view.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 4
        self.transcript.update_stream(*live)
        self.update_header(live[1])
        if at_end:
            self._scroll_to_end()

    def _finished(self, message_id: int) -> None:
        self.scheduler.forget(self)
        msg = next((m for m in self.session.messages if m.id == message_id), None)
        if msg is not None and self.transcript.streaming_id == message_id:
            self.transcript.end_stream(msg, self._actions(msg, message_id), msg.stats)
            self._scroll_to_end()
        else:
            self.rebuild()
        self.update_header()

    def showEvent(self, e) -> None:
        super().showEvent(e)
        if self.transcript.streaming_id is not None:
            self.scheduler.mark(self)

    def _actions(self, m, last_reply: int | None) -> list[tuple[str, str]]:
        if m.role == "user":
            return [("edit", "edit"), ("copy", "copy")]
        return [("copy", "copy")] + ([("regen", "regenerate")] if m.id == last_reply else [])

    def update_header(self, stats=None) -> None:
        self.title.setText(self.session.chat.title)
        running = self.session.running
        if stats is None:
            replies = [m for m in self.session.messages if m.role == "assistant"]
            live = self.session.live(replies[-1].id) if replies else None
            stats = live[1] if live else (replies[-1].stats if replies else None)
        self.state.setText(stats_text(stats).split(" · ")[0] if stats is not None else "")
        self.stop_btn.setEnabled(running)
        self.regen_btn.setEnabled(any(m.role == "user" for m in self.session.messages))

    def _scroll_to_end(self) -> None:
        bar = self.view.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _anchor(self, url: QUrl) -> None:
        self.focused.emit(self)
        verb, _, ident = url.path().partition("/") if url.scheme() == "pd" else ("", "", "")
        if not ident.isdigit():
            return
        message_id = int(ident)
        if verb == "copy":
            self._copy(message_id)
        elif verb == "edit":
            self.start_edit(message_id)
        elif verb == "regen":
            self.regenerate()

    def _copy(self, message_id: int) -> None:
        live = self.session.live(message_id)
        msg = next((m for m in self.session.messages if m.id == message_id), None)
        text = live[0] if live else (msg.content if msg else "")
        QGuiApplication.clipboard().setText(text)

    def _show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.setVisible(bool(text))

"""A chat pane: transcript, prompt box and reply controls over one ChatSession.

What the user does in it (buttons, links, the prompt box) is app.chat.pane_actions (PaneActions, a
mixin over the pane); its repaints are paced by app.chat.render_scheduler, one for all panes.

The transcript follows a streaming reply to its end (its stats line included) until the user scrolls
up, and again once they scroll back to the bottom. Nothing in a pane can change its minimum size: every
text that varies (title, state, context meter, banner, error) is an ElidedLabel.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout, QMenu, QPushButton, QSizePolicy, QStyle, QTabWidget, QTextBrowser, QToolButton, QToolTip, QVBoxLayout, QWidget,
)

from app.chat.attachments import Attachments, shown_images
from app.chat.chat_session import ChatSession
from app.chat.empty_state import EmptyState
from app.chat.message_actions import MessageActionBar
from app.chat.pane_actions import PaneActions
from app.chat.pane_extras import PinnedList, QueueList
from app.chat.pane_widgets import ACTIVITY, ColourSwatch, CompactButtons, ElidedLabel, activity_icon
from app.preferences.theme import quiet_text
from app.chat.prompt_edit import PromptEdit
from app.chat.render_scheduler import RenderScheduler
from app.chat.reply_display import shown
from app.chat.transcript import Transcript
from app.core.chat_colours import CHAT_COLOURS
from app.core.presets import matching_preset
from app.preferences.design_tokens import SPACE
from app.preferences.preferences import Preferences
from app.core.formatting import stats_text
from app.core.images import cannot_see_message, image_tokens, sees_images
from app.panels.tool_approval import ask_approval


STATUS_ROOM = 120  # what the status line's texts keep before the image button gives up its text


class ChatPane(PaneActions, QWidget):
    focused = Signal(object)  # self, when the user interacts with it (tile view tracks the latest)
    branched = Signal(int)  # id of a new chat made by "branch" on one of this chat's messages

    def __init__(self, session: ChatSession, scheduler: RenderScheduler, parent: QWidget | None = None):
        super().__init__(parent)
        self.session = session
        self.scheduler = scheduler
        self.editing: int | None = None  # id of the user message being edited
        self.editing_queued: int | None = None  # id of the queued message being edited
        self.expanded: set[int] = set()  # replies whose thinking is shown open
        self.approvals: list = []  # tool-call approval dialogs open now
        session.approver = lambda request: ask_approval(request, session.chat.title, self, self.approvals)

        chat_id = session.chat_id
        self.swatch = ColourSwatch(CHAT_COLOURS.acquire(chat_id))
        self.destroyed.connect(lambda _o=None: CHAT_COLOURS.release(chat_id))
        self.title = ElidedLabel()
        self.title.setStyleSheet("font-weight: bold")
        self.state = ElidedLabel()
        self.state.setStyleSheet(f"color: {quiet_text().name()}")
        self.meter = ElidedLabel()
        self.meter.setStyleSheet(f"color: {quiet_text().name()}")
        self.prompt_format = ElidedLabel(parent=self)  # the prompt format (template / plain text): in details
        self.prompt_format.hide()
        self.settings_btn = QToolButton(text="Settings…")
        self.regen_btn = QToolButton(text="Regenerate")
        self.stop_btn = QToolButton(text="Stop")
        self.stop_btn.setToolTip("Stop the reply (Esc)")
        self.more_btn = QToolButton(text="⋯")  # the rarer actions, so the header stays narrow
        self.more_btn.setToolTip("More actions")
        self.more_btn.setAccessibleName("More actions")
        self.more_btn.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        more = QMenu(self.more_btn)
        self.continue_action = more.addAction("Continue the last reply", self.continue_reply)
        more.addAction("Copy the last reply", self.copy_last)
        more.addAction("Tools and thinking…", self.open_tools)
        replies = more.addMenu("N replies at once")  # versions ‹ 1/N › of the last reply, in one batch
        for n in (2, 3, 4):
            replies.addAction(f"{n} replies", lambda n=n: self.regenerate_n(n))
        more.addAction("Branch from the last message", self.branch_last)
        more.addAction("Pin a document…", self.pick_document)
        self.more_btn.setMenu(more)
        head = QHBoxLayout()
        head.setSpacing(SPACE["xxs"])
        head.addWidget(self.swatch)
        head.addWidget(self.title, 1)
        for b in (self.settings_btn, self.regen_btn, self.stop_btn, self.more_btn):
            head.addWidget(b)
        self.header_buttons = CompactButtons([(self.settings_btn, QStyle.StandardPixmap.SP_FileDialogDetailedView),
                                              (self.regen_btn, QStyle.StandardPixmap.SP_BrowserReload),
                                              (self.stop_btn, QStyle.StandardPixmap.SP_MediaStop)])

        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self.view.anchorClicked.connect(self._anchor)
        self.transcript = Transcript(self.view.document())
        self.actions_bar = MessageActionBar(self.view, self.transcript,
                                            lambda verb, message_id: self._anchor(QUrl(f"pd:{verb}/{message_id}")))
        self.empty_state = EmptyState(self.view.viewport())
        self.empty_state.example_chosen.connect(self.fill_prompt)
        self.empty_state.preset_chosen.connect(self.use_preset)
        self.empty_state.pick_model.connect(self._pick_model)

        self._follow = True  # keep the end in view; off while the user has scrolled up
        self._scrolling = False
        bar = self.view.verticalScrollBar()
        bar.rangeChanged.connect(self._range_changed)
        bar.valueChanged.connect(self._scrolled)

        # One status line under the message box, always there (so showing a banner or an error never changes
        # the pane's size): what matters first (reply state, the editing banner, the last error, the context
        # meter, short where the pane is narrow), then Details (the last reply's whole stats line, the
        # context, the prompt format), the image button and Send.
        self.banner = ElidedLabel()
        self.banner.setStyleSheet("background: #fff3cd; color: #664d03; padding: 0 3px")
        self.banner.hide()
        self.error = ElidedLabel()
        self.error.setStyleSheet("color: #c0392b")
        self.error.hide()
        self.details_btn = QToolButton()
        self.details_btn.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxInformation))
        self.details_btn.setAutoRaise(True)
        self.details_btn.setAccessibleName("Details")
        self.details_btn.clicked.connect(self.show_details)
        self.prompt = PromptEdit()
        self.prompt.setPlaceholderText("Message — Enter sends")
        self.prompt.setToolTip("Enter sends · Shift+Enter: a new line · Esc stops the reply")
        self.prompt.grow(3, 6)
        self.prompt.setTabChangesFocus(True)  # Tab moves on (a keyboard user is never stuck in the box)
        self.prompt.setAccessibleDescription("Enter sends; Shift+Enter starts a new line; Esc stops the reply")
        self.send_btn = QPushButton("Send")
        self.send_btn.setDefault(True)
        self.send_btn.setMaximumWidth(self.send_btn.fontMetrics().horizontalAdvance("Send") + 28)  # not 80 px
        self.attachments = Attachments(self, lambda images: image_tokens(session.backend, images, session.settings),
                                       lambda: sees_images(session.backend, session.settings))
        self.prompt.attachments = self.attachments
        self.attachments.accept_drops(self, self.view.viewport(), self.prompt.viewport())
        self.attachments.problem.connect(self._show_error)
        self.attachments.changed.connect(self._attachments_changed)
        texts = QWidget()  # ignored width: a banner or an error shown never widens the pane's minimum
        texts.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        line = QHBoxLayout(texts)
        line.setContentsMargins(0, 0, 0, 0)
        line.setSpacing(SPACE["xs"])
        for label, stretch in ((self.state, 3), (self.banner, 6), (self.error, 6), (self.meter, 2)):
            line.addWidget(label, stretch)
        status = QHBoxLayout()
        status.setSpacing(SPACE["xs"])
        status.addWidget(texts, 1)
        for button in (self.details_btn, self.attachments.button, self.send_btn):
            status.addWidget(button)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*[SPACE["xs"]] * 4)
        self.pinned_list = PinnedList(session)
        self.queue_list = QueueList(session)  # messages sent while it replies, under the prompt box
        self.queue_list.edit_requested.connect(self.start_queued_edit)
        layout.addLayout(head)
        layout.addWidget(self.pinned_list)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.attachments)
        layout.addWidget(self.prompt)  # the whole pane wide: a narrow tile still has room to write
        layout.addLayout(status)
        layout.addWidget(self.queue_list)

        self.footer_buttons = CompactButtons([(self.attachments.button, QStyle.StandardPixmap.SP_DirOpenIcon)])
        # Tab goes through the pane top to bottom: header buttons, the conversation, the message box, the
        # buttons under it (the image button was made after Send, which would put it last).
        chain = [self.settings_btn, self.regen_btn, self.stop_btn, self.more_btn, self.view,
                 *self.actions_bar.buttons.values(), self.prompt,
                 self.details_btn, self.attachments.button, self.send_btn]
        for a, b in zip(chain, chain[1:]):
            QWidget.setTabOrder(a, b)
        self.prompt.submitted.connect(self.submit)
        self.send_btn.clicked.connect(self.submit)
        self.stop_btn.clicked.connect(self.stop)
        self.regen_btn.clicked.connect(self.regenerate)
        self.settings_btn.clicked.connect(self.open_settings)
        esc = QShortcut(QKeySequence(Qt.Key.Key_Escape), self, context=Qt.ShortcutContext.WidgetWithChildrenShortcut)
        esc.activated.connect(self.escape)

        session.history_changed.connect(self.rebuild)
        session.reply_changed.connect(self._reply_changed)
        session.reply_finished.connect(self._finished)
        session.renamed.connect(lambda _t: self.update_header())
        session.settings_changed.connect(self.update_meter)
        session.activity_changed.connect(self._activity)
        self.rebuild()

    # --- rendering -----------------------------------------------------------------------------

    def rebuild(self) -> None:
        """Whole transcript from the session's messages (after send/edit/regenerate/load)."""
        self.transcript.clear()
        msgs = self.session.messages
        last_reply = max((m.id for m in msgs if m.role == "assistant"), default=None)
        for m in msgs:
            live = self.session.live_view(m.id)
            if live is not None:
                self.transcript.begin_stream(m, self._actions(m, last_reply))
                self.transcript.update_stream(*live)
            else:
                message, thinking = shown(self.session, m, self.expanded)
                self.transcript.append(message, self._actions(m, last_reply), m.stats, thinking,
                                       *self._images_of(m))
        self.update_header()
        self.update_meter()
        self.actions_bar.refresh()
        self._follow = True
        self._scroll_to_end()

    def render_stream(self) -> None:
        """Called by the scheduler: bring the streaming reply's tail and stats up to date."""
        sid = self.transcript.streaming_id
        live = self.session.live_view(sid) if sid is not None else None
        if live is None:
            return
        self.transcript.update_stream(*live)
        self.update_header(live[1])
        if self._follow:
            self._scroll_to_end()

    def _reply_changed(self, _message_id: int) -> None:
        if self.session.running:
            self.scheduler.mark(self)
        else:  # a stop has been recorded: the Stop button goes
            self.update_header()

    def _finished(self, message_id: int) -> None:
        self.scheduler.forget(self)
        msg = next((m for m in self.session.messages if m.id == message_id), None)
        if msg is not None and self.transcript.streaming_id == message_id:
            message, thinking = shown(self.session, msg, self.expanded)
            self.transcript.end_stream(message, self._actions(msg, message_id), msg.stats, thinking,
                                       *self._images_of(msg))
            if self._follow:
                self._scroll_to_end()
        else:
            self.rebuild()
        self.actions_bar.refresh()
        self.update_header()
        self.update_meter()

    def resizeEvent(self, e) -> None:  # noqa: N802
        super().resizeEvent(e)
        m = self.layout().contentsMargins()  # the header's fixed parts: margins, colour swatch, "⋯"
        self.header_buttons.fit(self.width() - m.left() - m.right() - self.swatch.width() - 12
                                - self.more_btn.sizeHint().width())
        self.footer_buttons.fit(self.width() - m.left() - m.right() - self.send_btn.sizeHint().width()
                                - self.details_btn.sizeHint().width() - STATUS_ROOM)

    def showEvent(self, e) -> None:
        super().showEvent(e)
        if self.transcript.streaming_id is not None:
            self.scheduler.mark(self)
        self.update_empty_state()  # a pane made for a new tile asked before it was in the window: which model?

    def _actions(self, m, last_reply: int | None) -> list[tuple[str, str]]:
        """Links in a message's header; ("", text) is plain text (the ‹1/3› version counter)."""
        versions = self.session.alternatives(m.id)
        nav = []
        if len(versions) > 1:
            i = versions.index(m.id)
            nav = [("prev", "‹") if i > 0 else ("", "‹"), ("", f"{i + 1}/{len(versions)}"),
                   ("next", "›") if i < len(versions) - 1 else ("", "›")]
        if m.role == "user":
            return nav + [("edit", "edit"), ("copy", "copy"), ("branch", "branch from here")]
        last = m.id == last_reply and m is self.session.messages[-1]
        return nav + [("copy", "copy"), ("branch", "branch from here")] + (
            [("regen", "regenerate")] if last else []) + (
            [("continue", "continue")] if last and self.session.can_continue() else [])

    def update_header(self, stats=None) -> None:
        title = self.session.chat.title
        self.title.setText(title)
        if self.prompt.accessibleName() != f"Message to {title}":  # the chat's name, so a tile is told apart
            self.prompt.setAccessibleName(f"Message to {title}")
            self.view.setAccessibleName(f"Conversation: {title}")
            self.setAccessibleName(f"Chat: {title}")
        running = self.session.running
        if stats is None:
            replies = [m for m in self.session.messages if m.role == "assistant"]
            live = self.session.live(replies[-1].id) if replies else None
            stats = live[1] if live else (replies[-1].stats if replies else None)
        self.state.setText(stats_text(stats).split(" · ")[0] if stats is not None else "")
        self._update_details()
        self.stop_btn.setEnabled(running)
        self.regen_btn.setEnabled(any(m.role == "user" for m in self.session.messages))
        self.continue_action.setEnabled(self.session.can_continue())
        CHAT_COLOURS.set_label(self.session.chat_id, self.session.chat.title)
        if running and stats is not None and stats.prompt_tokens is not None:
            self._set_meter(stats.prompt_tokens + stats.new_tokens, stats.dropped_turns)

    def update_meter(self) -> None:
        """Context meter: tokens this chat's next prompt holds (or the last reply's prompt + reply) / the limit;
        and the prompt format beside it."""
        self.update_format()
        replies = [m for m in self.session.messages if m.role == "assistant" and m.stats is not None]
        last = replies[-1].stats if replies else None
        if last is not None and last.prompt_tokens is not None and self.session.messages[-1].role == "assistant":
            self._set_meter(last.prompt_tokens + last.new_tokens, last.dropped_turns)
            return
        history = [{"role": m.role, "content": m.content} for m in self.session.messages]
        used = self.session.backend.count_tokens(history, self.session.prompt_settings())  # None: can't count
        images = [im for m in self.session.messages if m.role == "user" for im in self.session.images.of(m.id)]
        cost = image_tokens(self.session.backend, images + self.attachments.images, self.session.settings)
        self._set_meter(used + cost if used is not None and cost is not None else used, 0)

    def update_format(self) -> None:
        """Name the prompt format the next reply is sent in (the model's template, a fallback, plain text)."""
        self.update_empty_state()
        fmt = self.session.backend.prompt_format()
        if fmt is None:
            self.prompt_format.setText("")
            self._update_details()
            return
        self.prompt_format.setText(f"format: {fmt['short']}")
        tip = f"Prompt format: {fmt['label']}"
        if fmt["kind"] == "plain":
            tip += ("\nThe chat is sent as plain text for the model to continue (no chat turns): a base model "
                    "completes text rather than answering.")
        self.prompt_format.setToolTip(tip + "\nChange it in the Model tab (Prompt format).")
        self._update_details()

    def update_empty_state(self) -> None:
        """The start page shows while the chat has no message: the model in use, the presets, examples."""
        empty = not self.session.messages
        self.empty_state.setVisible(empty)
        if not empty:
            return
        info = getattr(getattr(self.window(), "service", None), "info", None)
        self.empty_state.set_model(info.get("name") if isinstance(info, dict) else None)
        presets = Preferences().presets()
        self.empty_state.set_presets(list(presets), matching_preset(self.session.settings, presets))

    def _pick_model(self) -> None:
        """The window's "Switch model" command (a quick pick of recent models)."""
        action = self.window().findChild(QAction, "switch_model")
        if action is not None:
            action.trigger()

    def details(self) -> str:
        """What the status line folds away: the last reply's whole stats line, the context, the prompt format."""
        replies = [m for m in self.session.messages if m.role == "assistant"]
        live = self.session.live(replies[-1].id) if replies else None
        stats = live[1] if live else (replies[-1].stats if replies else None)
        lines = [f"Last reply: {stats_text(stats)}" if stats is not None else "No reply yet."]
        if self.meter.text():
            lines.append(f"Context: {self.meter.text().removeprefix('context ')}")
        if self.prompt_format.text():
            lines.append(self.prompt_format.toolTip())
        return "\n".join(lines)

    def _update_details(self) -> None:
        text = self.details()
        if text != self.details_btn.toolTip():
            self.details_btn.setToolTip(text)
            self.details_btn.setAccessibleDescription(text)

    def show_details(self) -> None:
        """The details as a popover under the button (also its tooltip)."""
        QToolTip.showText(self.details_btn.mapToGlobal(self.details_btn.rect().bottomLeft()), self.details(),
                          self.details_btn)

    def _set_meter(self, used: int | None, dropped: int) -> None:
        limit = self.session.backend.context_limit(self.session.settings)
        if limit is None:
            self.meter.setText("")
            return
        text = f"context {used if used is not None else '?'} / {limit} tok"
        compact = f"{used if used is not None else '?'}/{_k(limit)}"
        if dropped:  # whole turns the chat's context overflow policy left out of the prompt (the chat keeps them)
            text += f" · {dropped} turn{'s' if dropped != 1 else ''} left out of the prompt"
            compact += f" −{dropped}"
        self.meter.setText(text, compact)
        self._update_details()

    def _images_of(self, m) -> tuple[list, str]:
        return shown_images(self.session, m)

    def _attachments_changed(self) -> None:
        """Say at once when the chat's model can't see images (the message would be refused)."""
        seeing = sees_images(self.session.backend, self.session.settings)
        self._show_error(cannot_see_message(attached=True) if self.attachments.images and seeing is False else "")
        self.update_meter()

    def _activity(self, state: str) -> None:
        self.update_header()
        self._mark_tab()

    def _mark_tab(self) -> None:
        """Mark this chat's tab (if it is in one) with its colour and a dot while a reply is under way."""
        tabs = self.parentWidget().parentWidget() if self.parentWidget() is not None else None
        if isinstance(tabs, QTabWidget) and (i := tabs.indexOf(self)) >= 0:
            state = self.session.activity
            tabs.setTabIcon(i, activity_icon(state, self.swatch.colour()))
            tabs.setTabToolTip(i, ACTIVITY[state][1] if state else self.session.chat.title)

    def event(self, e) -> bool:
        if e.type() == QEvent.Type.ParentChange:  # put into (or out of) the tab widget: mark it once added
            QTimer.singleShot(0, self, self._mark_tab)  # (self as context: dropped if the pane goes first)
        return super().event(e)

    def _scroll_to_end(self) -> None:
        bar = self.view.verticalScrollBar()
        self._scrolling = True
        bar.setValue(bar.maximum())
        self._scrolling = False

    def _range_changed(self, _lo: int, _hi: int) -> None:
        """The document grew (its layout runs after the update, so this is when the new end is known)."""
        if self._follow:
            self._scroll_to_end()

    def _scrolled(self, value: int) -> None:
        if not self._scrolling:  # the user moved it: follow only while they are at the end
            self._follow = value >= self.view.verticalScrollBar().maximum() - 4

    def _show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.setVisible(bool(text))


def _k(tokens: int) -> str:
    """A context size as the compact meter shows it: 4096 -> "4k", 131072 -> "128k", 3000 -> "3000"."""
    return f"{tokens // 1024}k" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)

"""PaneActions: what the user does in a chat pane (send, stop, regenerate, edit, branch, versions, copy,
settings, tools, pinned documents) and the links in its transcript.

A mixin over ChatPane's state (`session`, `prompt`, `attachments`, `banner`, `editing`, ...): each action
hands the work to the pane's ChatSession and shows a refusal as the pane's error line.
"""
from __future__ import annotations

from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication, QTextCursor
from PySide6.QtWidgets import QDialog, QFileDialog

from app.chat.code_blocks import COPY_VERB
from app.core.presets import apply_preset
from app.core.tasks import spawn
from app.panels.chat_tools_dialog import ChatToolsDialog
from app.panels.settings_dialog import SettingsDialog
from app.preferences.preferences import Preferences


class PaneActions:
    """The user's actions of ChatPane."""

    def submit(self) -> None:
        text, images = self.prompt.toPlainText(), list(self.attachments.images)
        if not text.strip() and not images:
            return
        self.focused.emit(self)
        self._show_error("")
        if self.editing is not None:
            message_id, self.editing = self.editing, None
            self.banner.hide()
            self.prompt.clear()
            spawn(self.session.edit(message_id, text), self._show_error)
            return
        self.prompt.clear()
        try:
            if self.editing_queued is not None:
                item_id, self.editing_queued = self.editing_queued, None
                self.banner.hide()
                self.session.edit_queued(item_id, text)
            else:
                self.session.submit(text, images)  # queued while a reply runs (text only)
                self.attachments.clear()
        except Exception as exc:  # noqa: BLE001
            if images:  # not sent (a model that can't see images, a reply running): the draft stays
                self.prompt.setPlainText(text)
            self._show_error(str(exc))

    def send(self, text: str) -> None:
        """Send `text` as if typed into the prompt box and Enter pressed."""
        self.prompt.setPlainText(text)
        self.submit()

    def stop(self) -> None:
        """Stop the reply; the next queued message (if any) goes out then."""
        async def stop_then_next() -> None:
            await self.session.stop()
            self.session.send_next()
        spawn(stop_then_next(), self._show_error)

    def escape(self) -> None:
        if self.editing is not None or self.editing_queued is not None:
            self.editing = self.editing_queued = None
            self.banner.hide()
            self.prompt.clear()
        else:
            self.stop()

    def fill_prompt(self, text: str) -> None:
        """Put `text` in the message box to read and edit before sending (an example prompt)."""
        self.prompt.setPlainText(text)
        self.prompt.moveCursor(QTextCursor.MoveOperation.End)
        self.prompt.setFocus()

    def use_preset(self, name: str) -> None:
        """Sample this chat's replies with preset `name` (its other settings stay)."""
        presets = Preferences().presets()
        if name not in presets:
            self._show_error(f"no preset named {name!r}")
            return
        self.session.set_settings(apply_preset(self.session.settings, presets[name]))
        self.update_empty_state()

    def regenerate(self) -> None:
        self._show_error("")
        spawn(self.session.regenerate(), self._show_error)

    def regenerate_n(self, n: int) -> None:
        """Answer the last user message n times at once; the replies are its versions ‹ 1/n ›."""
        self._show_error("")
        spawn(self.session.regenerate_n(n), self._show_error)

    def continue_reply(self) -> None:
        self._show_error("")
        spawn(self.session.continue_reply(), self._show_error)

    def branch(self, message_id: int) -> int | None:
        """Make a new chat sharing this one's history up to `message_id` (the window opens it)."""
        try:
            chat_id = self.session.branch(message_id)
        except (ValueError, KeyError) as exc:
            self._show_error(str(exc))
            return None
        self.branched.emit(chat_id)
        return chat_id

    def branch_last(self) -> int | None:
        """Branch from the chat's last message (a new chat with the whole history so far)."""
        if not self.session.messages:
            self._show_error("Nothing to branch from yet: the chat is empty.")
            return None
        return self.branch(self.session.messages[-1].id)

    def show_alternative(self, message_id: int, step: int) -> None:
        try:
            self.session.select_alternative(message_id, step)
        except RuntimeError as exc:
            self._show_error(str(exc))

    def copy_last(self) -> None:
        replies = [m for m in self.session.messages if m.role == "assistant"]
        if replies:
            self._copy(replies[-1].id)

    def open_settings(self) -> None:
        dlg = SettingsDialog(self.session.settings, f"Settings — {self.session.chat.title}", self,
                             adapters=self.session.backend.adapter_names())
        if dlg.exec() == QDialog.DialogCode.Accepted:
            self.session.set_settings(dlg.settings())

    def open_tools(self) -> ChatToolsDialog:
        """The chat's MCP tools, thinking switch and reasoning effort (non-blocking: the tools are listed while
        it is open)."""
        from app.agent.reply_rounds import takes_effort, thinks

        template = self.session.backend.chat_template(self.session.settings)
        dlg = ChatToolsDialog(self.session.settings, self.session.tools, thinks(template), self.session.chat.title,
                              self, effort_setting=takes_effort(template))
        dlg.accepted.connect(lambda: self.session.set_settings(dlg.settings()))
        dlg.open()
        self.tools_dialog = dlg
        return dlg

    def start_edit(self, message_id: int) -> None:
        msg = next((m for m in self.session.messages if m.id == message_id), None)
        if msg is None or msg.role != "user":
            return
        self.editing, self.editing_queued = message_id, None
        self.prompt.setPlainText(msg.content)
        self.prompt.setFocus()
        self.banner.setText("Editing a message: sending makes a new version of it; the old one stays as an "
                            "alternative (Esc cancels).")
        self.banner.show()

    def start_queued_edit(self, item) -> None:
        self.editing, self.editing_queued = None, item.id
        self.prompt.setPlainText(item.content)
        self.prompt.setFocus()
        self.banner.setText("Editing a queued message: Enter saves it in the queue (Esc cancels).")
        self.banner.show()

    def pick_document(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Pin a document", "", "Documents (*.txt *.md *.pdf);;All files (*)")
        if path:
            self.pin_document(path)

    def pin_document(self, path: str) -> bool:
        """Pin a text or PDF file to this chat; a refusal (too big, unreadable) shows as the pane's error."""
        try:
            self.session.pin_document(path)
        except ValueError as exc:
            self._show_error(str(exc))
            return False
        self._show_error("")
        return True

    def _anchor(self, url: QUrl) -> None:
        self.focused.emit(self)
        verb, _, ident = url.path().partition("/") if url.scheme() == "pd" else ("", "", "")
        if not ident.isdigit():
            return
        message_id = int(ident)
        if verb == "copy":
            self._copy(message_id)
        elif verb == COPY_VERB:  # a code block's Copy link: its exact text
            QGuiApplication.clipboard().setText(self.transcript.code_blocks.text(message_id))
        elif verb == "edit":
            self.start_edit(message_id)
        elif verb == "regen":
            self.regenerate()
        elif verb == "continue":
            self.continue_reply()
        elif verb == "branch":
            self.branch(message_id)
        elif verb == "think":  # fold a reply's thinking open or shut, where the user is reading
            self.expanded ^= {message_id}
            at = self.view.verticalScrollBar().value()
            self.rebuild()
            self._follow = False
            self.view.verticalScrollBar().setValue(at)
        elif verb in ("prev", "next"):
            self.show_alternative(message_id, -1 if verb == "prev" else 1)

    def _copy(self, message_id: int) -> None:
        live = self.session.live(message_id)
        msg = next((m for m in self.session.messages if m.id == message_id), None)
        text = live[0] if live else (msg.content if msg else "")
        QGuiApplication.clipboard().setText(text)

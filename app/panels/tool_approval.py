"""The dialog that asks before a model's tool call runs: which tool, on which server, with which arguments.

It is opened window-modal but not with exec(): the reply's coroutine awaits the answer while the event
loop (and every other chat) keeps running. "Always allow this tool" is remembered (app.agent.approvals).
"""
from __future__ import annotations

import asyncio
import json

from PySide6.QtWidgets import QCheckBox, QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.agent.tool_hub import Approval, ToolRequest


class ToolApprovalDialog(QDialog):
    def __init__(self, request: ToolRequest, chat_title: str, parent: QWidget | None = None):
        super().__init__(parent)
        tool = request.tool
        self.setWindowTitle(f"Allow a tool call? — {chat_title}")
        self.setModal(False)
        about = QLabel(f"The model wants to call <b>{tool.name}</b> on the MCP server <b>{tool.server}</b>."
                       + (f"<br><small>{tool.description}</small>" if tool.description else ""))
        about.setWordWrap(True)
        self.arguments = QPlainTextEdit()
        self.arguments.setReadOnly(True)
        try:
            shown = json.dumps(json.loads(request.arguments_json or "{}"), indent=2, ensure_ascii=False)
        except ValueError:
            shown = request.arguments_json
        self.arguments.setPlainText(shown)
        self.arguments.setMaximumHeight(160)
        self.always = QCheckBox(f"Always allow {tool.name} (from {tool.server})")
        self.buttons = QDialogButtonBox()
        self.allow_button = self.buttons.addButton("Allow", QDialogButtonBox.ButtonRole.AcceptRole)
        self.deny_button = self.buttons.addButton("Deny", QDialogButtonBox.ButtonRole.RejectRole)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(about)
        layout.addWidget(QLabel("Arguments:"))
        layout.addWidget(self.arguments)
        layout.addWidget(self.always)
        layout.addWidget(self.buttons)

    def approval(self) -> Approval:
        ok = self.result() == QDialog.DialogCode.Accepted
        return Approval(ok, ok and self.always.isChecked())


async def ask_approval(request: ToolRequest, chat_title: str, parent: QWidget | None,
                       shown: list | None = None) -> Approval:
    """Show the dialog and wait for the answer; a cancelled wait (the reply was stopped) closes it."""
    dialog = ToolApprovalDialog(request, chat_title, parent)
    done = asyncio.get_running_loop().create_future()
    dialog.finished.connect(lambda _r: done.done() or done.set_result(dialog.approval()))
    if shown is not None:
        shown.append(dialog)
    dialog.open()
    try:
        return await done
    finally:
        if shown is not None and dialog in shown:
            shown.remove(dialog)
        if dialog.isVisible():
            dialog.reject()
        dialog.deleteLater()

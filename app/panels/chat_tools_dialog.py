"""A chat's tools and thinking: which MCP tools its model may call, the thinking switch and the reasoning effort.

The tools are listed from the configured servers when the dialog opens (on the event loop: a slow server
never freezes the window); tools the chat had picked whose server is not reachable now stay listed and
picked, marked as unavailable. The thinking switch applies only where the model's template has one, the
reasoning effort (low, medium, high) only to a harmony model (gpt-oss), whose system message says it.
"""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QListWidget, QListWidgetItem, QVBoxLayout,
    QWidget,
)

from app.agent.mcp_client import McpTool
from app.agent.tool_hub import ToolHub
from app.core.store import ChatSettings
from app.core.tasks import spawn
from engine.chat.harmony import REASONING_EFFORTS


class ChatToolsDialog(QDialog):
    def __init__(self, settings: ChatSettings, hub: ToolHub | None, thinking_switch: bool, title: str,
                 parent: QWidget | None = None, effort_setting: bool = False):
        super().__init__(parent)
        self.setWindowTitle(f"Tools and thinking — {title}")
        self._settings = settings
        self.status = QLabel("Listing the MCP servers' tools…" if hub is not None and hub.servers else
                             "No MCP servers are configured: add them with Chat ▸ MCP servers….")
        self.status.setWordWrap(True)
        self.tools = QListWidget()
        self.thinking = QCheckBox("Let the model think before it answers")
        self.thinking.setChecked(settings.thinking)
        self.thinking.setEnabled(thinking_switch)
        if not thinking_switch:
            self.thinking.setToolTip("The loaded model's chat template has no thinking switch")
        self.effort = QComboBox()
        for level in REASONING_EFFORTS:
            self.effort.addItem(level.capitalize(), level)
        self.effort.setCurrentIndex(REASONING_EFFORTS.index(settings.reasoning_effort))
        self.effort.setEnabled(effort_setting)
        self.effort.setToolTip("How long the model thinks before it answers (its system message says it)"
                               if effort_setting else "Only a harmony model (gpt-oss) takes a reasoning effort")
        effort_row = QFormLayout()
        effort_row.addRow("Reasoning effort:", self.effort)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Tools this chat's model may call (each call asks you first):"))
        layout.addWidget(self.tools, 1)
        layout.addWidget(self.status)
        layout.addWidget(self.thinking)
        layout.addLayout(effort_row)
        layout.addWidget(buttons)
        self.resize(480, 360)
        self._fill([])
        self.listing = spawn(self._list(hub), self.status.setText) if hub is not None and hub.servers else None

    async def _list(self, hub: ToolHub) -> None:
        tools = await hub.manager.all_tools()
        self._fill(tools)
        errors = "; ".join(hub.manager.errors.values())
        self.status.setText(f"{len(tools)} tools from {len(hub.servers)} servers" + (f". {errors}" if errors else ""))

    def _fill(self, tools: list[McpTool]) -> None:
        picked = set(self.checked()) if self.tools.count() else set(self._settings.tools)
        self.tools.clear()
        offered = {t.key for t in tools}
        for t in tools:
            self._item(t.key, f"{t.key} — {t.description.splitlines()[0] if t.description else ''}", t.key in picked)
        for key in sorted(picked - offered):
            self._item(key, f"{key} (not available now)", True)

    def _item(self, key: str, text: str, checked: bool) -> None:
        item = QListWidgetItem(text, self.tools)
        item.setData(Qt.ItemDataRole.UserRole, key)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)

    def checked(self) -> list[str]:
        return [self.tools.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.tools.count())
                if self.tools.item(i).checkState() == Qt.CheckState.Checked]

    def set_checked(self, key: str, on: bool = True) -> None:
        for i in range(self.tools.count()):
            if self.tools.item(i).data(Qt.ItemDataRole.UserRole) == key:
                self.tools.item(i).setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)

    def settings(self) -> ChatSettings:
        return replace(self._settings, tools=tuple(self.checked()), thinking=self.thinking.isChecked(),
                       reasoning_effort=self.effort.currentData())

"""The MCP servers dialog: the app's mcp.json (LM Studio's and Claude Desktop's format), edited as text,
an existing mcp.json imported, the servers checked (started, their tools listed), and the remembered
"always allow" choices forgotten.

Saving validates the whole file first (an error names the server and field) and keeps the text open, so
a typo never loses the user's edit; the saved servers are used by the next tool call.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QDialog, QFileDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget,
)

from app.agent.mcp_config import dump_config, parse_config
from app.agent.tool_hub import ToolHub
from app.core.tasks import spawn

EXAMPLE = """{
  "mcpServers": {
    "calc": {"command": "python", "args": ["/path/to/server.py"], "env": {}},
    "web": {"url": "http://127.0.0.1:8000/mcp"}
  }
}
"""


class McpServersDialog(QDialog):
    def __init__(self, hub: ToolHub, parent: QWidget | None = None):
        super().__init__(parent)
        self.hub = hub
        self.setWindowTitle("MCP servers")
        intro = QLabel(f"Servers in <code>{hub.path}</code> (the <code>mcp.json</code> format of LM Studio and "
                       "Claude Desktop): a <code>command</code> with <code>args</code>/<code>env</code> (stdio) or a "
                       "streamable HTTP <code>url</code>. Pick a chat's tools in its ⋯ ▸ Tools and thinking….")
        intro.setWordWrap(True)
        self.editor = QPlainTextEdit()
        self.editor.setPlainText(dump_config(hub.servers) if hub.servers or hub.path.exists() else EXAMPLE)
        if hub.config_error:
            self.editor.setPlainText(hub.path.read_text(encoding="utf-8"))
        self.report = QLabel(hub.config_error or "")
        self.report.setWordWrap(True)
        self.approvals = QLabel()
        self.save_btn = QPushButton("Save")
        self.import_btn = QPushButton("Import mcp.json…")
        self.check_btn = QPushButton("Save and check servers")
        self.forget_btn = QPushButton("Forget “always allow”")
        close = QPushButton("Close")
        row = QHBoxLayout()
        for b in (self.save_btn, self.check_btn, self.import_btn, self.forget_btn):
            row.addWidget(b)
        row.addStretch(1)
        row.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.editor, 1)
        layout.addWidget(self.report)
        layout.addWidget(self.approvals)
        layout.addLayout(row)
        self.save_btn.clicked.connect(self.save)
        self.check_btn.clicked.connect(self.check)
        self.import_btn.clicked.connect(self.import_dialog)
        self.forget_btn.clicked.connect(self.forget_approvals)
        close.clicked.connect(self.accept)
        self.resize(640, 480)
        self._show_approvals()

    def save(self) -> bool:
        """Validate and save the text; False (and the reason shown) when it is not a valid mcp.json."""
        try:
            servers = parse_config(self.editor.toPlainText())
        except ValueError as exc:
            self.report.setText(f"Not saved: {exc}")
            return False
        self.saving = spawn(self.hub.set_servers(servers), self.report.setText)
        self.report.setText(f"Saved {len(servers)} servers.")
        return True

    def check(self) -> None:
        if self.save():
            self.checking = spawn(self._check(), self.report.setText)

    async def _check(self) -> None:
        await self.saving
        self.report.setText("Starting the servers…")
        tools = await self.hub.manager.all_tools()
        lines = []
        for name in self.hub.servers:
            names = [t.name for t in tools if t.server == name]
            lines.append(f"{name}: " + (self.hub.manager.errors.get(name) or f"{len(names)} tools ({', '.join(names)})"))
        self.report.setText("\n".join(lines) or "No servers configured.")

    def import_file(self, path: str | Path) -> None:
        """Add the servers of another mcp.json to the text (same names replaced); saved with Save."""
        try:
            incoming = parse_config(Path(path).read_text(encoding="utf-8"))
            current = parse_config(self.editor.toPlainText())
        except (OSError, ValueError) as exc:
            self.report.setText(f"Not imported: {exc}")
            return
        current.update(incoming)
        self.editor.setPlainText(dump_config(current))
        self.report.setText(f"Imported {', '.join(incoming) or 'no servers'} from {path}; Save to keep them.")

    def import_dialog(self) -> None:
        name, _ = QFileDialog.getOpenFileName(self, "Import mcp.json", str(Path.home()), "JSON (*.json)")
        if name:
            self.import_file(name)

    def forget_approvals(self) -> None:
        for key in self.hub.approvals.keys:
            self.hub.approvals.revoke(key)
        self._show_approvals()

    def _show_approvals(self) -> None:
        keys = self.hub.approvals.keys
        self.approvals.setText("Always allowed: " + (", ".join(keys) if keys else "none (every call asks)"))
        self.forget_btn.setEnabled(bool(keys))

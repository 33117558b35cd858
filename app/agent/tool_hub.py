"""The app's tools in one place: the MCP servers (from mcp.json), their sessions, and the approvals.

A chat names the tools it may use ("server/tool"); `chat_tools` gives the ones that are there now, under
the names the model sees. `run_call` is the one path a model's call takes: unknown tools are refused, a
tool not "always allowed" waits for the user's answer (the `approve` callback, a dialog in the app), and
the call runs with the manager's timeout; whatever happens comes back as (state, text) for the chat to
show and the model to read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from app.agent.approvals import ToolApprovals
from app.agent.mcp_client import McpManager, McpTool
from app.agent.mcp_config import McpServerConfig, config_path, load_config, save_config


@dataclass(frozen=True)
class ToolRequest:
    """A call waiting for the user's approval."""

    chat_id: int
    tool: McpTool
    arguments_json: str


@dataclass(frozen=True)
class Approval:
    allowed: bool
    always: bool = False  # "always allow this tool": later calls of it run without asking


Approver = Callable[[ToolRequest], Awaitable[Approval]]


class ToolHub:
    def __init__(self, path: Path | None = None, manager: McpManager | None = None,
                 approvals: ToolApprovals | None = None):
        self.path = path or config_path()
        self.approvals = approvals or ToolApprovals(self.path.parent / "mcp_approvals.json")
        self.config_error: str | None = None  # why mcp.json could not be read (the MCP dialog shows it)
        if manager is None:  # the servers of mcp.json (a given manager brings its own)
            manager = McpManager()
            try:
                manager.servers = load_config(self.path)
            except ValueError as exc:
                self.config_error = str(exc)
        self.manager = manager

    @property
    def servers(self) -> dict[str, McpServerConfig]:
        return self.manager.servers

    async def set_servers(self, servers: dict[str, McpServerConfig]) -> None:
        """Save a new server list to mcp.json and use it."""
        save_config(servers, self.path)
        self.config_error = None
        await self.manager.configure(servers)

    @staticmethod
    def names_seen(keys: tuple[str, ...]) -> set[str]:
        """Every name a chat's tools can have for the model (chat_tools': the tool's own name, or
        server_name on a clash), without asking the servers: what a stored reply's calls may name."""
        pairs = [key.partition("/")[::2] for key in keys]
        return {name for _, name in pairs} | {f"{server}_{name}" for server, name in pairs}

    async def chat_tools(self, keys: tuple[str, ...]) -> dict[str, McpTool]:
        """The chat's tools that its servers offer now, by the name the model sees (the tool's own name,
        or server_name where two servers offer the same name). Unreachable servers are left out."""
        wanted: dict[str, list[str]] = {}
        for key in keys:
            server, _, name = key.partition("/")
            wanted.setdefault(server, []).append(name)
        found: list[McpTool] = []
        for server, names in wanted.items():
            try:
                found += [t for t in await self.manager.tools(server) if t.name in names]
            except ConnectionError as exc:
                self.manager.errors[server] = str(exc)
        clash = {t.name for t in found if sum(u.name == t.name for u in found) > 1}
        return {(f"{t.server}_{t.name}" if t.name in clash else t.name): t for t in found}

    async def run_call(self, chat_id: int, tool: McpTool | None, name: str, arguments_json: str,
                       approve: Approver | None) -> tuple[str, str]:
        """(state, text) of one call: "done" with the result, "error" or "denied" with what happened."""
        if tool is None:
            return "error", f"no tool named {name!r} is enabled in this chat"
        try:
            arguments = json.loads(arguments_json or "{}")
        except ValueError as exc:
            return "error", f"the arguments are not valid JSON: {exc}"
        if not isinstance(arguments, dict):
            return "error", "the arguments must be a JSON object"
        if not self.approvals.always_allowed(tool.key):
            if approve is None:
                return "denied", "nobody is there to approve the call"
            answer = await approve(ToolRequest(chat_id, tool, arguments_json))
            if not answer.allowed:
                return "denied", "the user did not allow this call"
            if answer.always:
                self.approvals.allow_always(tool.key)
        result = await self.manager.call(tool.server, tool.name, arguments)
        return ("error" if result.is_error else "done"), result.text

    async def close(self) -> None:
        await self.manager.close()

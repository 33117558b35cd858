"""The user's MCP servers, in the `mcp.json` format LM Studio and Claude Desktop use.

    {"mcpServers": {"calc": {"command": "python", "args": ["calc.py"], "env": {"KEY": "v"}},
                    "web":  {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer x"}}}}

A server is either a stdio command (started by the app, speaking MCP on its stdin/stdout) or a streamable
HTTP URL. The file lives in the app's config folder (beside pagedeck.ini, so PAGEDECK_SETTINGS moves both);
an existing mcp.json (LM Studio's, Claude Desktop's, VS Code's "servers" spelling) can be imported into it.
Errors name the server and the field, so a hand-edited file says what is wrong with it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from engine import envs

CONFIG_NAME = "mcp.json"


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    disabled: bool = False

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def to_dict(self) -> dict:
        if self.command is not None:
            out: dict = {"command": self.command, "args": list(self.args)}
            if self.env:
                out["env"] = dict(self.env)
        else:
            out = {"url": self.url}
            if self.headers:
                out["headers"] = dict(self.headers)
        if self.disabled:
            out["disabled"] = True
        return out


def _strings(name: str, key: str, value, kind: type) -> None:
    ok = isinstance(value, list) and all(isinstance(v, str) for v in value) if kind is list else (
        isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()))
    if not ok:
        what = "a list of strings" if kind is list else "an object of string values"
        raise ValueError(f"MCP server {name!r}: {key!r} must be {what}")


def server_from_dict(name: str, raw) -> McpServerConfig:
    """One entry of `mcpServers`; ValueError naming the server and the problem."""
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise ValueError(f"MCP server name {name!r} must be a non-empty name without '/'")
    if not isinstance(raw, dict):
        raise ValueError(f"MCP server {name!r}: its entry must be an object")
    command, url = raw.get("command"), raw.get("url") or raw.get("serverUrl")
    if (command is None) == (url is None):
        raise ValueError(f"MCP server {name!r}: give either a 'command' (stdio) or a 'url' (streamable HTTP)")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise ValueError(f"MCP server {name!r}: 'command' must be a non-empty string")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise ValueError(f"MCP server {name!r}: 'url' must be an http:// or https:// URL, got {url!r}")
    args, env, headers = raw.get("args", []), raw.get("env", {}), raw.get("headers", {})
    _strings(name, "args", args, list)
    _strings(name, "env", env, dict)
    _strings(name, "headers", headers, dict)
    disabled = raw.get("disabled", False)
    if not isinstance(disabled, bool):
        raise ValueError(f"MCP server {name!r}: 'disabled' must be true or false")
    return McpServerConfig(name, command, tuple(args), dict(env), url, dict(headers), disabled)


def parse_config(text: str) -> dict[str, McpServerConfig]:
    """The servers of an mcp.json text (`mcpServers`, or VS Code's `servers`)."""
    try:
        raw = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"mcp.json is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("mcp.json must hold a JSON object with an 'mcpServers' object")
    servers = raw.get("mcpServers", raw.get("servers", {}))
    if not isinstance(servers, dict):
        raise ValueError("mcp.json: 'mcpServers' must be an object of name -> server")
    return {name: server_from_dict(name, entry) for name, entry in servers.items()}


def dump_config(servers: dict[str, McpServerConfig]) -> str:
    return json.dumps({"mcpServers": {n: s.to_dict() for n, s in servers.items()}}, indent=2) + "\n"


def config_dir() -> Path:
    """The app's config folder: PAGEDECK_SETTINGS's folder when set (tests), else the user config folder."""
    settings = envs.PAGEDECK_SETTINGS
    return settings.parent if settings is not None else Path(platformdirs.user_config_dir("pagedeck", appauthor=False))


def config_path() -> Path:
    return config_dir() / CONFIG_NAME


def load_config(path: Path | None = None) -> dict[str, McpServerConfig]:
    path = path or config_path()
    return parse_config(path.read_text(encoding="utf-8")) if path.exists() else {}


def save_config(servers: dict[str, McpServerConfig], path: Path | None = None) -> Path:
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dump_config(servers), encoding="utf-8")
    tmp.replace(path)  # a crash mid-write never leaves half a file
    return path


def import_config(source: Path, path: Path | None = None) -> list[str]:
    """Add the servers of another mcp.json (same names are replaced); returns the names imported."""
    incoming = parse_config(Path(source).read_text(encoding="utf-8"))
    servers = load_config(path)
    servers.update(incoming)
    save_config(servers, path)
    return list(incoming)

"""Sessions with the user's MCP servers (the official `mcp` SDK), on the app's asyncio loop.

Each server gets one connection, opened on first use and kept: a task that enters the SDK's transport
(a stdio subprocess, or streamable HTTP) and ClientSession and holds them open until the connection is
closed, because the SDK's task groups must be left by the task that entered them. Calls run from any task
on the same loop. A server that cannot start, crashes (its connection closes mid-call), hangs past the
call timeout or answers with an error gives a ToolResult with is_error and a sentence saying which; the
next use of a crashed server starts it again. Nothing here waits on the UI: the window stays responsive.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass

from app.agent.mcp_config import McpServerConfig

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class McpTool:
    server: str
    name: str
    description: str
    input_schema: dict

    @property
    def key(self) -> str:
        return f"{self.server}/{self.name}"

    def function_spec(self, exposed_name: str | None = None) -> dict:
        """The tool as an OpenAI-style function entry, what chat templates render in their `tools`."""
        return {"type": "function", "function": {"name": exposed_name or self.name, "description": self.description,
                                                 "parameters": self.input_schema or {"type": "object", "properties": {}}}}


@dataclass(frozen=True)
class ToolResult:
    text: str
    is_error: bool = False


class _Connection:
    """One server's transport and session, held open by its own task."""

    def __init__(self, config: McpServerConfig, errlog):
        self.config = config
        self.session = None
        self.tools: list[McpTool] = []
        self._errlog = errlog
        self._ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._close = asyncio.Event()
        self.task = asyncio.ensure_future(self._hold())

    @property
    def alive(self) -> bool:
        return not self.task.done()

    async def ready(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except asyncio.TimeoutError:
            raise ConnectionError(f"MCP server {self.config.name!r} did not start within {timeout:g} s") from None

    async def _transport(self, stack: contextlib.AsyncExitStack):
        c = self.config
        if c.command is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(command=c.command, args=list(c.args), env=dict(c.env) or None)
            return await stack.enter_async_context(stdio_client(params, errlog=self._errlog))
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        client = await stack.enter_async_context(httpx2.AsyncClient(headers=c.headers or None, timeout=CALL_TIMEOUT_S))
        return await stack.enter_async_context(streamable_http_client(c.url, http_client=client))

    async def _hold(self) -> None:
        from mcp.client.session import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await self._transport(stack)
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                listed = await session.list_tools()
                self.tools = [McpTool(self.config.name, t.name, t.description or "",
                                      dict(getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {}))
                              for t in listed.tools]
                self.session = session
                self._ready.set_result(None)
                await self._close.wait()
        except BaseException as exc:  # noqa: BLE001 - a failed start is reported through ready()
            if not self._ready.done():
                self._ready.set_exception(ConnectionError(
                    f"MCP server {self.config.name!r} could not start: {_reason(exc)}"))
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.info("MCP server %s connection ended: %s", self.config.name, _reason(exc))
        finally:
            self.session = None

    async def close(self) -> None:
        self._close.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self.task), 10)
        if not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


def _reason(exc: BaseException) -> str:
    """The innermost message of an exception (the SDK wraps failures in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class McpManager:
    """The app's MCP servers: their tools, and calls to them with a timeout."""

    def __init__(self, servers: dict[str, McpServerConfig] | None = None, call_timeout_s: float = CALL_TIMEOUT_S,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.servers: dict[str, McpServerConfig] = dict(servers or {})
        self.call_timeout_s = call_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._connections: dict[str, _Connection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.errors: dict[str, str] = {}  # server -> why it could not be listed, for the MCP panel
        # The servers' stderr (their logs and tracebacks) goes to one file, never into the app's terminal.
        self.log_path = os.path.join(tempfile.gettempdir(), f"pagedeck-mcp-{os.getpid()}.log")
        self._errlog = None

    async def configure(self, servers: dict[str, McpServerConfig]) -> None:
        """Use a new server list; connections whose server changed or went are closed."""
        for name in list(self._connections):
            if servers.get(name) != self.servers.get(name):
                await self._connections.pop(name).close()
        self.servers = dict(servers)
        self.errors = {n: e for n, e in self.errors.items() if n in servers}

    async def _connection(self, name: str) -> _Connection:
        if name not in self.servers or self.servers[name].disabled:
            raise ConnectionError(f"no MCP server named {name!r} is configured")
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            conn = self._connections.get(name)
            if conn is None or not conn.alive:
                if self._errlog is None:
                    self._errlog = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - kept for the servers
                conn = self._connections[name] = _Connection(self.servers[name], self._errlog)
            try:
                await conn.ready(self.connect_timeout_s)
            except ConnectionError:
                self._connections.pop(name, None)
                await conn.close()
                raise
            return conn

    async def tools(self, server: str) -> list[McpTool]:
        conn = await self._connection(server)
        return list(conn.tools)

    async def all_tools(self) -> list[McpTool]:
        """Every enabled server's tools; a server that fails is left out and its error kept in `errors`."""
        out: list[McpTool] = []
        for name, config in self.servers.items():
            if config.disabled:
                continue
            try:
                out += await self.tools(name)
                self.errors.pop(name, None)
            except ConnectionError as exc:
                self.errors[name] = str(exc)
        return out

    async def call(self, server: str, tool: str, arguments: dict, timeout_s: float | None = None) -> ToolResult:
        """Run one tool call; every failure comes back as an error result that says what happened."""
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        try:
            conn = await self._connection(server)
        except ConnectionError as exc:
            return ToolResult(str(exc), True)
        if tool not in {t.name for t in conn.tools}:
            return ToolResult(f"MCP server {server!r} has no tool named {tool!r}", True)
        try:
            result = await asyncio.wait_for(conn.session.call_tool(tool, arguments, read_timeout_seconds=timeout),
                                            timeout + 5)
        except (asyncio.TimeoutError, TimeoutError):
            return ToolResult(f"the tool {tool!r} did not answer within {timeout:g} s", True)
        except Exception as exc:  # noqa: BLE001 - a dead or broken server: said in the chat, the chat goes on
            text = _reason(exc)
            if "timed out" in text:
                return ToolResult(f"the tool {tool!r} did not answer within {timeout:g} s", True)
            if not conn.alive or "closed" in text.lower():
                text = f"MCP server {server!r} stopped during the call ({text}); it is restarted on next use"
                self._connections.pop(server, None)
                await conn.close()
            return ToolResult(text, True)
        return ToolResult(_result_text(result), bool(getattr(result, "is_error", getattr(result, "isError", False))))

    async def close(self) -> None:
        for name in list(self._connections):
            await self._connections.pop(name).close()
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None


def _result_text(result) -> str:
    """A CallToolResult as text for the model: its text parts; other content (images, resources) as JSON."""
    parts = []
    for item in getattr(result, "content", None) or []:
        if getattr(item, "type", None) == "text":
            parts.append(item.text)
        else:
            parts.append(json.dumps(item.model_dump(mode="json", exclude_none=True)))
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)

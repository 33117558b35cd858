"""A small MCP server for the app's tests, written with the official SDK: `add`, `lookup`, and tools that
fail in each way a real server can (an error result, a crash mid-call, a call that never answers).

Run over stdio (default) or streamable HTTP on loopback: `python calc.py http PORT`.
"""
from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("calc")
FACTS = {"pagedeck": "a paged batched generator", "capital of france": "Paris"}


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def lookup(key: str) -> str:
    """Look a fact up by its key."""
    if key.lower() not in FACTS:
        raise ToolError(f"no fact for {key!r}")
    return FACTS[key.lower()]


@server.tool()
def crash(reason: str = "") -> str:
    """Exit the server process in the middle of the call."""
    os._exit(3)


@server.tool()
def hang(seconds: float = 3600) -> str:
    """Never answer (within any sane timeout)."""
    time.sleep(seconds)
    return "woke up"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()

"""Helpers for the MCP tests: the test server (tests/data/mcp_servers/calc.py, written with the official SDK)
as a stdio config, or started as a real streamable HTTP server on loopback."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

from app.agent.mcp_config import McpServerConfig

CALC = Path(__file__).resolve().parents[1] / "data" / "mcp_servers" / "calc.py"


def calc_stdio(name: str = "calc") -> McpServerConfig:
    return McpServerConfig(name, command=sys.executable, args=(str(CALC),))


@contextlib.contextmanager
def calc_http():
    """The calc server over streamable HTTP on a free loopback port; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(CALC), "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the HTTP MCP test server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)

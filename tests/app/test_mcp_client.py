"""The app's MCP client against a real MCP server process (the SDK's own server, over stdio and over
streamable HTTP on loopback), mcp.json parsing and import, and remembered approvals."""
from __future__ import annotations

import asyncio
import json

import pytest

from app.agent.approvals import ToolApprovals
from app.agent.mcp_client import McpManager
from app.agent.mcp_config import McpServerConfig, import_config, load_config, parse_config, save_config
from app.agent.tool_hub import Approval, ToolHub
from tests.app.mcp_support import calc_http, calc_stdio


def test_stdio_server_tools_results_errors_hangs_and_crashes():
    async def main():
        manager = McpManager({"calc": calc_stdio()}, call_timeout_s=2)
        try:
            tools = {t.name: t for t in await manager.tools("calc")}
            assert {"add", "lookup", "crash", "hang"} <= set(tools)
            assert tools["add"].input_schema["required"] == ["a", "b"]
            spec = tools["add"].function_spec()
            assert spec["function"]["name"] == "add" and spec["function"]["parameters"]["type"] == "object"
            assert (await manager.call("calc", "add", {"a": 2, "b": 3})).text == "5"
            error = await manager.call("calc", "lookup", {"key": "nope"})
            assert error.is_error and "no fact for 'nope'" in error.text
            hung = await manager.call("calc", "hang", {})
            assert hung.is_error and "did not answer within 2 s" in hung.text
            crashed = await manager.call("calc", "crash", {})
            assert crashed.is_error and "stopped during the call" in crashed.text
            # the crashed server is started again on next use
            assert (await manager.call("calc", "add", {"a": 40, "b": 2})).text == "42"
            missing = await manager.call("calc", "nope", {})
            assert missing.is_error and "no tool named 'nope'" in missing.text
        finally:
            await manager.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_streamable_http_server_and_a_server_that_cannot_start():
    async def main(url):
        manager = McpManager({"web": McpServerConfig("web", url=url),
                              "broken": McpServerConfig("broken", command="/nonexistent/mcp-server")})
        try:
            tools = await manager.all_tools()
            assert {t.key for t in tools} >= {"web/add", "web/lookup"}
            assert "broken" in manager.errors and "could not start" in manager.errors["broken"]
            assert (await manager.call("web", "lookup", {"key": "capital of France"})).text == "Paris"
            failed = await manager.call("broken", "add", {"a": 1, "b": 2})
            assert failed.is_error and "could not start" in failed.text
        finally:
            await manager.close()

    with calc_http() as url:
        asyncio.run(asyncio.wait_for(main(url), 120))


def test_mcp_json_parsing_names_the_bad_server_and_field(tmp_path):
    text = json.dumps({"mcpServers": {
        "calc": {"command": "python", "args": ["calc.py"], "env": {"A": "1"}},
        "web": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer x"}}}})
    servers = parse_config(text)
    assert servers["calc"].transport == "stdio" and servers["calc"].env == {"A": "1"}
    assert servers["web"].transport == "http" and servers["web"].headers["Authorization"] == "Bearer x"
    assert parse_config(json.dumps({"servers": {"v": {"command": "x"}}}))["v"].command == "x"  # VS Code's key
    for bad, words in [({"a": {"args": []}}, "'a': give either"),
                       ({"a": {"command": "x", "args": "y"}}, "'a': 'args' must be a list"),
                       ({"a": {"url": "ftp://x"}}, "'a': 'url' must be an http"),
                       ({"a/b": {"command": "x"}}, "without '/'")]:
        with pytest.raises(ValueError, match=words):
            parse_config(json.dumps({"mcpServers": bad}))
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_config("{nope")
    path = tmp_path / "mcp.json"
    save_config(servers, path)
    assert load_config(path) == servers
    other = tmp_path / "claude_desktop_config.json"
    other.write_text(json.dumps({"mcpServers": {"web": {"url": "http://127.0.0.1:1/mcp"}, "new": {"command": "y"}}}))
    assert sorted(import_config(other, path)) == ["new", "web"]
    merged = load_config(path)
    assert set(merged) == {"calc", "web", "new"} and merged["web"].url == "http://127.0.0.1:1/mcp"


def test_approvals_are_asked_once_remembered_and_denials_reported(tmp_path):
    asked = []

    async def main():
        hub = ToolHub(tmp_path / "mcp.json", McpManager({"calc": calc_stdio()}))
        try:
            tools = await hub.chat_tools(("calc/add", "calc/lookup", "gone/x"))
            assert set(tools) == {"add", "lookup"}

            async def deny(request):
                asked.append(request.tool.key)
                return Approval(False)

            assert await hub.run_call(1, tools["add"], "add", '{"a": 1, "b": 2}', deny) == (
                "denied", "the user did not allow this call")

            async def always(request):
                asked.append(request.tool.key)
                return Approval(True, always=True)

            assert await hub.run_call(1, tools["add"], "add", '{"a": 1, "b": 2}', always) == ("done", "3")
            assert await hub.run_call(1, tools["add"], "add", '{"a": 2, "b": 2}', deny) == ("done", "4")  # not asked
            assert await hub.run_call(1, None, "rm", "{}", always) == ("error", "no tool named 'rm' is enabled in this chat")
            state, text = await hub.run_call(1, tools["lookup"], "lookup", "{broken", always)
            assert state == "error" and "not valid JSON" in text
        finally:
            await hub.close()

    asyncio.run(asyncio.wait_for(main(), 120))
    assert asked == ["calc/add", "calc/add"]
    assert ToolApprovals(tmp_path / "mcp_approvals.json").always_allowed("calc/add")  # remembered on disk

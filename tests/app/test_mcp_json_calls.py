"""MCP tools called the way small models really write calls: plain JSON instead of the template's
<tool_call> tags. The real window, the tiny model through the real EngineService (each round's text forced
token by token, as in test_mcp_chat), a real MCP server process (the official SDK's calc server): a fenced
```json block (Qwen2.5-Coder's form) and a list of `{"function": ...}` calls must run as calls, and their
JSON must never show while the reply streams; JSON naming a tool the chat does not have stays the answer.
"""
from __future__ import annotations

import json

import pytest

from app.core.reply_trace import ReplyTrace
from app.core.store import ChatSettings
from tests.app.support import loop, run, store, tiny_model, wait_until  # noqa: F401
from tests.app.test_mcp_chat import hub_for, scripted, window_with

pytestmark = pytest.mark.timeout(300)

FENCED = "Let me add them.\n```json\n" + json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}}, indent=2) + "\n```"
LISTED = '[{"function": "add", "parameters": {"a": 5, "b": 1}}]'


def test_json_calls_run_as_mcp_calls_and_never_show_as_text(qtbot, loop, store, tiny_model, tmp_path):  # noqa: F811
    async def body():
        hub = hub_for(tmp_path)
        hub.approvals.allow_always("calc/add")
        service = await scripted(tiny_model, [FENCED, LISTED, "2 + 3 + 1 = 6."])
        window = window_with(qtbot, store, service, hub)
        pane = window.new_chat("json calls")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=120, seed=1, system_prompt="", tools=("calc/add",)))
        shown = []  # what the pane is given to show at every step of the stream
        s.reply_changed.connect(lambda mid: shown.append(s.live_view(mid)[0]) if s.live_view(mid) else None)
        pane.send("What is 2 + 3 + 1?")
        await wait_until(lambda: s.task.done(), 180, "the reply")
        reply = s.messages[-1]
        assert (reply.content, reply.stats.state) == ("2 + 3 + 1 = 6.", "done")
        calls = ReplyTrace(store).calls(reply.id)
        assert [(c.name, c.server, json.loads(c.arguments), c.state, c.result, c.preface) for c in calls] == [
            ("add", "calc", {"a": 2, "b": 3}, "done", "5", "Let me add them."),
            ("add", "calc", {"a": 5, "b": 1}, "done", "6", "")]
        # (the call blocks show each call's arguments and result; the model's JSON never shows)
        leaks = ("```json", '"name"', '"arguments"', '"function"', '"parameters"', "[{")
        assert len(shown) > 10 and not [t for t in shown if any(leak in t for leak in leaks)]
        text = pane.view.toPlainText()
        assert text.index("Let me add them.") < text.index("add · calc") < text.index("2 + 3 + 1 = 6.")
        # the results went back to the model as tool results, the calls in the template's own format
        assert "<tool_response>\n5\n</tool_response>" in service.prompts[1]
        assert "<tool_response>\n6\n</tool_response>" in service.prompts[2]
        await service.close()
        await hub.close()

    run(loop, body())


def test_json_naming_a_tool_the_chat_does_not_have_is_the_answer(qtbot, loop, store, tiny_model, tmp_path):  # noqa: F811
    answer = '```json\n{"name": "lookup", "arguments": {"key": "pi"}}\n```'

    async def body():
        hub = hub_for(tmp_path)
        service = await scripted(tiny_model, [answer])
        window = window_with(qtbot, store, service, hub)
        pane = window.new_chat("not a call")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=120, seed=1, system_prompt="", tools=("calc/add",)))
        pane.send("Show me a lookup call as JSON.")
        await wait_until(lambda: s.task.done(), 180, "the reply")
        reply = s.messages[-1]
        assert (reply.content, reply.stats.state) == (answer, "done")
        assert ReplyTrace(store).calls(reply.id) == [] and len(service.prompts) == 1 and not pane.approvals
        assert '"lookup"' in pane.view.toPlainText()
        await service.close()
        await hub.close()

    run(loop, body())

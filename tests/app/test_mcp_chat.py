"""MCP tools and thinking in real chats: the real window, the tiny model through the real EngineService, a
real MCP server process. The model's text is forced (a ChoiceFilter per round: the engine still generates
it token by token, and the app parses it as any reply), so the tool calls and the thinking are known; the
parsing, the approval dialog, the MCP calls, the transcript, the history and the export are the real ones.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from PySide6.QtCore import QUrl

from app.agent.mcp_client import McpManager
from app.agent.tool_hub import ToolHub
from app.core.export import export_chat
from app.core.reply_trace import ReplyTrace
from app.core.store import ChatSettings, Store
from app.local.engine_service import EngineService
from tests.app.mcp_support import calc_stdio
from tests.app.support import TINY_CACHE_TOKENS, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(300)


def call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


class ScriptedService(EngineService):
    """The real engine service; each reply round's text is forced to the next scripted one, and each
    round's prompt text is kept."""

    def __init__(self, script: list[str]):
        super().__init__()
        self.script = list(script)
        self.prompts: list[str] = []

    def start_job(self, identifier, history, settings, tools=None):
        self.prompts.append(self.render_prompt(history, settings, tools))
        return super().start_job(identifier, history, settings, tools)

    def _filters(self, settings):
        import engine

        return [engine.ChoiceFilter([self.script.pop(0)])]


async def scripted(model, script):
    service = ScriptedService(script)
    assert await service.load({"path": str(model), "cache_tokens": TINY_CACHE_TOKENS})
    return service


def hub_for(tmp_path, timeout_s=60.0) -> ToolHub:
    return ToolHub(tmp_path / "mcp.json", McpManager({"calc": calc_stdio()}, call_timeout_s=timeout_s))


def window_with(qtbot, store, service, hub):
    window = make_window(qtbot, store, service)
    window.tools = window.chats.tools = hub
    return window


def _click(pane, verb, message_id):
    pane._anchor(QUrl(f"pd:{verb}/{message_id}"))


def test_a_chat_calls_an_approved_mcp_tool_and_answers_with_its_result(qtbot, loop, store, tiny_model, tmp_path):
    async def body():
        hub = hub_for(tmp_path)
        service = await scripted(tiny_model, ["Let me add them. " + call("add", a=2, b=3), "2 + 3 = 5."])
        window = window_with(qtbot, store, service, hub)
        pane = window.new_chat("sums")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=200, seed=1, tools=("calc/add", "calc/lookup")))
        shown = []  # what the pane is given to show at every step of the stream
        s.reply_changed.connect(lambda mid: shown.append(s.live_view(mid)[0]) if s.live_view(mid) else None)
        pane.send("What is 2 + 3?")
        await wait_until(lambda: pane.approvals, 120, "the approval dialog")
        dialog = pane.approvals[0]
        assert "add" in dialog.windowTitle() or "add" in dialog.always.text()
        assert json.loads(dialog.arguments.toPlainText()) == {"a": 2, "b": 3}
        await wait_until(lambda: "waiting for your approval of add" in pane.view.toPlainText(), 10, "the note")
        dialog.allow_button.click()
        await wait_until(lambda: s.task.done(), 120, "the reply")
        reply = s.messages[-1]
        assert reply.content == "2 + 3 = 5." and reply.stats.state == "done"
        calls = ReplyTrace(store).calls(reply.id)
        assert [(c.name, c.server, c.state, c.result, c.preface) for c in calls] == [
            ("add", "calc", "done", "5", "Let me add them.")]
        text = pane.view.toPlainText()
        assert text.index("Let me add them.") < text.index("add · calc") < text.index("2 + 3 = 5.")
        assert "<tool_call>" not in text
        assert len(shown) > 10 and not any("<tool" in t or '"arguments"' in t for t in shown)  # never half a call
        # the second round's prompt held the tool list, the call and its result; the first only the tools
        first, second = service.prompts
        assert '"name": "add"' in first and "<tool_response>\n5\n</tool_response>" in second
        # export: the call and its result are in both formats
        doc = json.loads(export_chat(store, s.chat_id, tmp_path / "chat.json").read_text())
        exported = doc["messages"][-1]["tool_calls"][0]
        assert exported["name"] == "add" and exported["result"] == "5" and json.loads(exported["arguments"]) == {"a": 2, "b": 3}
        md = export_chat(store, s.chat_id, tmp_path / "chat.md").read_text()
        assert "**Tool call** `calc/add` (done)" in md and md.index("Let me add them.") < md.index("2 + 3 = 5.")
        await service.close()
        await hub.close()
        return s.chat_id

    chat_id = run(loop, body())
    # the history survives a reopen: a new store and window show the call and its result
    store.close()
    reopened = Store.open(store.path.parent)
    try:
        window = make_window(qtbot, reopened, EngineService())
        pane = window.chats.open_chat(chat_id)
        text = pane.view.toPlainText()
        assert "add · calc" in text and "2 + 3 = 5." in text and "5" in text
    finally:
        reopened.close()


def test_failing_tools_are_reported_and_the_chat_keeps_working(qtbot, loop, store, tiny_model, tmp_path):
    async def body():
        hub = hub_for(tmp_path, timeout_s=2)
        for tool in ("crash", "hang", "lookup", "add"):
            hub.approvals.allow_always(f"calc/{tool}")  # no dialogs: "always allow" was chosen before
        service = await scripted(tiny_model, [
            call("crash"), call("hang"), call("nope"), "Sorry, the tools failed.",
            call("lookup", key="nothing"), call("add", a=1, b=1), "1 + 1 = 2."])
        window = window_with(qtbot, store, service, hub)
        pane = window.new_chat("errors")
        s = pane.session
        # (the tiny model's context is 512 tokens: two tools' descriptions at a time)
        s.set_settings(ChatSettings(max_new_tokens=40, seed=1, system_prompt="", tools=("calc/crash", "calc/hang")))
        pane.send("Try the tools.")
        await wait_until(lambda: s.task.done(), 180, "the reply")
        calls = ReplyTrace(store).calls(s.messages[-1].id)
        assert [c.state for c in calls] == ["error"] * 3, (s.messages[-1].stats, [c.result for c in calls])
        assert "stopped during the call" in calls[0].result
        assert "did not answer within 2 s" in calls[1].result
        assert "no tool named 'nope' is enabled" in calls[2].result
        assert s.messages[-1].content == "Sorry, the tools failed."
        text = pane.view.toPlainText()
        assert "stopped during the call" in text and "did not answer within 2 s" in text
        # the crashed server is started again; the chat goes on
        s.set_settings(replace(s.settings, tools=("calc/lookup", "calc/add")))
        pane.send("Look it up, then add 1 + 1.")
        await wait_until(lambda: s.task.done() and not s.running, 120, "the second reply")
        assert s.messages[-1].content == "1 + 1 = 2.", s.messages[-1].stats
        lookup, add = ReplyTrace(store).calls(s.messages[-1].id)
        assert lookup.state == "error" and "no fact for 'nothing'" in lookup.result
        assert (add.state, add.result) == ("done", "2")
        await service.close()
        await hub.close()

    run(loop, body())


def test_a_denied_call_is_shown_and_the_model_is_told(qtbot, loop, store, tiny_model, tmp_path):
    async def body():
        hub = hub_for(tmp_path)
        service = await scripted(tiny_model, [call("add", a=1, b=2), "I may not use the tool.", call("add", a=3, b=4)])
        window = window_with(qtbot, store, service, hub)
        pane = window.new_chat("deny")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=200, seed=1, tools=("calc/add",)))
        pane.send("1 + 2?")
        await wait_until(lambda: pane.approvals, 120, "the approval dialog")
        pane.approvals[0].deny_button.click()
        await wait_until(lambda: s.task.done(), 120, "the reply")
        assert ReplyTrace(store).calls(s.messages[-1].id)[0].state == "denied"
        assert "not allowed" in pane.view.toPlainText()
        assert "error: the user did not allow this call" in service.prompts[-1]
        assert not hub.approvals.always_allowed("calc/add")
        # stopping the reply while its call waits for approval closes the dialog and records both
        pane.send("Again?")
        await wait_until(lambda: pane.approvals, 120, "the second approval dialog")
        closed = []
        pane.approvals[0].finished.connect(closed.append)
        pane.stop()
        await wait_until(lambda: not s.running, 30, "the stop")
        assert closed and not pane.approvals  # the dialog went away with the reply
        assert s.messages[-1].stats.state == "stopped"
        stopped = ReplyTrace(store).calls(s.messages[-1].id)
        assert [(c.state, c.result) for c in stopped] == [("error", "the reply was stopped during the call")]
        await service.close()
        await hub.close()

    run(loop, body())


def test_thinking_is_a_collapsed_section_with_tokens_and_time_and_not_sent_back(qtbot, loop, store, tiny_model,
                                                                               tmp_path):
    async def body():
        service = await scripted(tiny_model, ["<think>The user wants a greeting. I will say hello.</think>Hello there!",
                                              "Fine, thanks."])
        window = make_window(qtbot, store, service)
        pane = window.new_chat("think")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=200, seed=1))
        notes, shown = [], []
        s.reply_changed.connect(lambda mid: (notes.append(s.live_view(mid)[2]), shown.append(s.live_view(mid)[0]))
                                if s.live_view(mid) else None)
        pane.send("Hi")
        await wait_until(lambda: s.task.done(), 120, "the reply")
        reply = s.messages[-1]
        assert any(n.startswith("thinking… ") for n in notes) and any(n.startswith("thought for ") for n in notes)
        assert not any("greeting" in t or "<think" in t for t in shown)  # the thinking never streams as the answer
        thought = ReplyTrace(store).thinking(reply.id)
        assert thought is not None and thought.tokens > 3 and thought.seconds >= 0
        text = pane.view.toPlainText()
        assert f"Thought for {thought.seconds:.1f} s · {thought.tokens} tokens" in text
        assert "Hello there!" in text and "I will say hello" not in text  # collapsed
        _click(pane, "think", reply.id)
        assert "I will say hello" in pane.view.toPlainText()  # opened
        _click(pane, "think", reply.id)
        assert "I will say hello" not in pane.view.toPlainText()
        pane.send("How are you?")
        await wait_until(lambda: s.task.done() and not s.running, 120, "the second reply")
        later = service.prompts[-1]
        assert "Hello there!" in later and "I will say hello" not in later and "<think>" not in later
        doc = json.loads(export_chat(store, s.chat_id, tmp_path / "think.json").read_text())
        assert doc["messages"][1]["thinking"] == {"text": "The user wants a greeting. I will say hello.",
                                                  "tokens": thought.tokens, "seconds": thought.seconds}
        md = export_chat(store, s.chat_id, tmp_path / "think.md").read_text()
        assert "<details><summary>Thought for" in md and md.index("I will say hello") < md.index("Hello there!")
        await service.close()

    run(loop, body())

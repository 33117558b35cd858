"""Harmony (gpt-oss) chats in the app: the real window and EngineService over a tiny scripted harmony model
(tests/harmony_models.py: a vocabulary with harmony's special tokens, a harmony template, a greedy reply
the test chose). The analysis channel is the reply's folded thinking line, the final channel its answer;
the chat's reasoning effort (set in its Tools and thinking dialog) reaches the harmony system message;
a commentary-channel call runs through the chat's MCP tool path."""
from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QUrl

from app.agent.mcp_client import McpManager
from app.agent.reply_rounds import MAX_ROUNDS
from app.agent.tool_hub import ToolHub
from app.core.export import export_chat
from app.core.reply_trace import ReplyTrace
from app.core.store import ChatSettings
from app.local.engine_service import EngineService
from tests.app.mcp_support import calc_stdio
from tests.app.support import TINY_CACHE_TOKENS, loop, make_window, run, store, wait_until  # noqa: F401
from tests.harmony_models import ANSWER, THOUGHT, answer_model, call_model

pytestmark = pytest.mark.timeout(300)


class RecordingService(EngineService):
    """The real engine service, keeping each reply round's prompt text."""

    def __init__(self):
        super().__init__()
        self.prompts: list[str] = []

    def start_job(self, identifier, history, settings, tools=None):
        self.prompts.append(self.render_prompt(history, settings, tools))
        return super().start_job(identifier, history, settings, tools)


async def loaded(model) -> RecordingService:
    service = RecordingService()
    assert await service.load({"path": str(model), "cache_tokens": TINY_CACHE_TOKENS})
    return service


@pytest.fixture(scope="module")
def harmony_answer(tmp_path_factory):
    return answer_model(tmp_path_factory.mktemp("harmony") / "answer")


def test_the_analysis_channel_is_the_folded_thinking_line_and_the_effort_reaches_the_prompt(
        qtbot, loop, store, harmony_answer, tmp_path):  # noqa: F811
    async def body():
        service = await loaded(harmony_answer)
        window = make_window(qtbot, store, service)
        pane = window.new_chat("gpt-oss")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=40, seed=1))
        dialog = pane.open_tools()  # the chat's Tools and thinking dialog: the effort applies to this model
        assert dialog.effort.isEnabled() and dialog.effort.currentData() == "medium"
        dialog.effort.setCurrentIndex(dialog.effort.findData("high"))
        dialog.accept()
        assert s.settings.reasoning_effort == "high"
        shown, notes = [], []
        s.reply_changed.connect(lambda mid: (shown.append(s.live_view(mid)[0]), notes.append(s.live_view(mid)[2]))
                                if s.live_view(mid) else None)
        pane.send("Hi")
        await wait_until(lambda: s.task.done(), 120, "the reply")
        reply = s.messages[-1]
        assert reply.stats.state == "done", reply.stats
        assert "Reasoning: high" in service.prompts[0] and service.prompts[0].endswith("<|start|>assistant")
        assert any(n.startswith("thinking… ") for n in notes)
        assert not any(THOUGHT in t or "<|" in t for t in shown)  # the analysis never streams as the answer
        thought = ReplyTrace(store).thinking(reply.id)
        assert thought is not None and thought.tokens >= 1  # (the scripted thought is one token)
        text = pane.view.toPlainText()
        assert f"Thought for {thought.seconds:.1f} s · {thought.tokens} tokens" in text
        assert ANSWER in text and THOUGHT not in text and "<|channel|>" not in text  # folded
        pane._anchor(QUrl(f"pd:think/{reply.id}"))
        assert THOUGHT in pane.view.toPlainText()  # unfolded
        doc = json.loads(export_chat(store, s.chat_id, tmp_path / "chat.json").read_text())
        assert doc["messages"][1]["thinking"]["text"] == THOUGHT and doc["messages"][1]["content"].endswith(ANSWER)
        md = export_chat(store, s.chat_id, tmp_path / "chat.md").read_text()
        assert md.index(THOUGHT) < md.index(ANSWER) and "<|channel|>" not in md
        pane.send("And now?")
        await wait_until(lambda: s.task.done() and not s.running, 120, "the second reply")
        later = service.prompts[-1]  # the earlier answer goes back on the final channel, its thinking does not
        assert f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|end|>" in later and THOUGHT not in later
        await service.close()

    run(loop, body())


def test_a_harmony_call_runs_through_the_chat_s_mcp_tools(qtbot, loop, store, tmp_path):  # noqa: F811
    model = call_model(tmp_path / "caller", "add", '{"a": 2, "b": 3}')

    async def body():
        hub = ToolHub(tmp_path / "mcp.json", McpManager({"calc": calc_stdio()}, call_timeout_s=60))
        hub.approvals.allow_always("calc/add")
        service = await loaded(model)
        window = make_window(qtbot, store, service)
        window.tools = window.chats.tools = hub
        pane = window.new_chat("calls")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=60, seed=1, system_prompt="", tools=("calc/add",)))
        pane.send("What is 2 + 3?")
        await wait_until(lambda: s.task.done(), 240, "the reply's rounds")
        reply = s.messages[-1]
        calls = ReplyTrace(store).calls(reply.id)
        # the scripted model calls again after every result: the app stops it at its round limit
        assert len(calls) == MAX_ROUNDS - 1 and reply.stats.error == f"stopped after {MAX_ROUNDS} rounds of tool calls"
        first = calls[0]
        assert (first.name, first.server, first.state, first.result) == ("add", "calc", "done", "5")
        assert json.loads(first.arguments) == {"a": 2, "b": 3} and first.reasoning == "I need the weather in Paris."
        # the tools were in the developer message; the next round's prompt holds the call and its result
        assert "namespace functions {" in service.prompts[0] and "type add = (_: {" in service.prompts[0]
        second = service.prompts[1]
        assert ('<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>'
                '{"a": 2, "b": 3}<|call|><|start|>functions.add to=assistant<|channel|>commentary<|message|>5<|end|>'
                in second)
        assert "<|channel|>analysis<|message|>I need the weather in Paris.<|end|>" in second  # the turn goes on
        text = pane.view.toPlainText()
        assert "add · calc" in text and "<|channel|>" not in text
        await service.close()
        await hub.close()

    run(loop, body())


def test_pagedeck_run_shows_the_analysis_channel_as_thinking_only_when_asked(tmp_path, harmony_answer):
    from tests.cli.support import cli_env, pagedeck

    env = cli_env(tmp_path, own_home=False)
    r = pagedeck(["run", str(harmony_answer), "--greedy", "--max-tokens", "30", "hi"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ANSWER
    shown = pagedeck(["run", str(harmony_answer), "--greedy", "--max-tokens", "30", "--think", "hi"], env)
    assert shown.returncode == 0, shown.stderr
    assert THOUGHT in shown.stdout and shown.stdout.rstrip().endswith(ANSWER) and "<|" not in shown.stdout

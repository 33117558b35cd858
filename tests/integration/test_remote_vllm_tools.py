"""MCP tools in a remote chat served by a real vLLM CPU server (`make test-vllm`), with the default model.

The chat is pagedeck's own: ChatSession with RemoteBackend, the ToolHub with the calc MCP server as a
real process, the approval path. vLLM runs with `--enable-auto-tool-choice --tool-call-parser hermes
--tool-strict-level parameter` (tools/peers/vllm_server.py):

- a named tool_choice: vLLM constrains the reply to a call of that function (a structural tag whose
  arguments follow the tool's schema), parses it and streams it as `tool_calls` deltas; the chat puts
  them together, runs the MCP tool, sends its result as a `role: tool` message (the next round asks
  tool_choice "none") and gets a text answer;
- "auto": vLLM's Hermes parser reads the call out of the model's text. SmolLM2 knows no tools (its
  template renders none), so its text is forced to a Hermes call by vLLM's own structured outputs (a
  regex, added to the first request only), the way tests/app/test_mcp_chat.py forces the local model's
  text: the parsing on the server, the streaming and everything in the app are the real ones.

Reasoning through vLLM, and what of it the default model leaves untested: test_remote_vllm_reasoning.py.
"""
from __future__ import annotations

import json
import re

import pytest

from app.agent.mcp_client import McpManager
from app.agent.tool_hub import Approval, ToolHub
from app.chat.chat_session import ChatSession
from app.core.remote_backend import RemoteBackend
from app.core.store import ChatSettings
from engine import envs
from tests.app.mcp_support import calc_stdio
from tests.app.support import loop, run, store, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(900)

QUESTION = "What is 2 + 3? Use the add tool."
NAMED = {"type": "function", "function": {"name": "add"}}
FORCED_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def _chat(loop, store, tmp_path, tool_choice, force_first: str | None = None):  # noqa: F811
    """Run one remote chat turn with the calc server's add tool; returns (reply, its calls, approvals asked,
    the request bodies sent)."""
    asked, bodies = [], []

    async def approve(request):
        asked.append(json.loads(request.arguments_json))
        return Approval(True)

    async def body():
        backend = RemoteBackend(envs.PAGEDECK_VLLM_URL)
        await backend.connect()
        backend.tool_choice = tool_choice
        stream_chat = backend.client.stream_chat

        def recording(request_body):
            if force_first is not None and not bodies:  # the model's text, forced by vLLM's structured outputs
                request_body = {**request_body, "structured_outputs": {"regex": re.escape(force_first)}}
            bodies.append(request_body)
            return stream_chat(request_body)

        backend.client.stream_chat = recording
        hub = ToolHub(tmp_path / "mcp.json", McpManager({"calc": calc_stdio()}, call_timeout_s=60))
        chat = store.create_chat("vllm tools", ChatSettings(max_new_tokens=96, temperature=0.0, system_prompt="",
                                                            tools=("calc/add",)))
        session = ChatSession(store, chat.id, backend, tools=hub)
        session.approver = approve
        try:
            session.send(QUESTION)
            await wait_until(lambda: session.task.done(), 600, "the reply")
            reply = session.messages[-1]
            return reply, session.trace.calls(reply.id)
        finally:
            await hub.close()
            await backend.close()

    reply, calls = run(loop, body(), 800)
    return reply, calls, asked, bodies


def test_a_named_tool_choice_calls_the_mcp_tool_and_the_answer_follows(qtbot, loop, store, tmp_path):  # noqa: F811
    reply, calls, asked, bodies = _chat(loop, store, tmp_path, NAMED)
    assert reply.stats.state == "done", reply.stats
    (call,) = calls
    args = json.loads(call.arguments)  # vLLM's streamed argument pieces, put together
    assert call.name == "add" and call.state == "done" and asked == [args]
    assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    assert call.result == str(args["a"] + args["b"])  # what the MCP server computed
    assert [b["tool_choice"] for b in bodies] == [NAMED, "none"]
    assert bodies[1]["messages"][-1] == {"role": "tool", "tool_call_id": call.call_id, "content": call.result}
    assert json.loads(bodies[1]["messages"][-2]["tool_calls"][0]["function"]["arguments"]) == args
    assert reply.content.strip()  # the answer, in text
    assert reply.stats.prompt_tokens and reply.stats.new_tokens > 0


def test_auto_tool_choice_reads_the_call_out_of_the_models_text(qtbot, loop, store, tmp_path):  # noqa: F811
    reply, calls, asked, bodies = _chat(loop, store, tmp_path, "auto", force_first=FORCED_CALL)
    assert reply.stats.state == "done", reply.stats
    (call,) = calls[:1]
    assert (call.name, json.loads(call.arguments), call.state, call.result) == ("add", {"a": 2, "b": 3}, "done", "5")
    assert asked[0] == {"a": 2, "b": 3}
    assert [b["tool_choice"] for b in bodies[:2]] == ["auto", "auto"]
    assert "<tool_call>" not in call.preface  # the server's parser took the call out of the text
    assert bodies[1]["messages"][-1] == {"role": "tool", "tool_call_id": call.call_id, "content": "5"}

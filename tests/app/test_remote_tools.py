"""A remote chat runs the app's MCP tools exactly as a local chat does: a real pagedeck server process
(tests/server_support.py) serving a scripted tiny model, a real MCP server process (the calc server over
stdio), the real ChatSession, ToolHub and approval path.

The scripted model (tests/scripted_models.py) writes a Hermes call in several tokens, so the server
streams it as OpenAI does (name first, then the arguments in pieces) and RemoteJob has to put the pieces
together. Its template ends the prompt after the tool's result with "Done:" only when that result is the
MCP server's real answer (5), and the script continues "Done:" with the answer: the second round's reply
proves the call ran through MCP and its result went back as a `role: tool` message. The chat's stop
string "Done:" ends the first round right after the call.
"""
from __future__ import annotations

import json

import pytest

from app.agent.mcp_client import McpManager
from app.agent.tool_hub import Approval, ToolHub
from app.chat.chat_session import ChatSession
from app.core.remote_backend import RemoteBackend, add_piece, chat_body, round_tool_choice
from app.core.store import ChatSettings
from tests.app.mcp_support import calc_stdio
from tests.app.support import loop, run, store, wait_until  # noqa: F401
from tests.scripted_models import write_scripted_model
from tests.server_support import ServerThread

pytestmark = pytest.mark.timeout(300)

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if '<tool_response>\n5\n</tool_response>' in messages[-1].content %}Done:{% endif %}{% endif %}")
ARGS = ['{"a": 2, ', '"b": 3}']
SCRIPT = ["Let me add.", "<tool_call>", '\n{"name": "add", "arguments": ', *ARGS, "}\n", "</tool_call>", "Done:",
          " 2 + 3 = 5"]
ANSWER = " 2 + 3 = 5"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = write_scripted_model(tmp_path_factory.mktemp("remote_tools") / "m", SCRIPT, TEMPLATE)
    with ServerThread(folder, cache_tokens=1024, page_size=16) as s:
        yield s


def test_a_remote_chat_calls_an_approved_mcp_tool_and_answers_with_its_result(server, qtbot, loop, store,  # noqa: F811
                                                                             tmp_path):
    asked = []

    async def approve(request):
        asked.append((request.tool.key, json.loads(request.arguments_json)))
        return Approval(True)

    async def body():
        backend = RemoteBackend(server.url)
        await backend.connect()
        hub = ToolHub(tmp_path / "mcp.json", McpManager({"calc": calc_stdio()}, call_timeout_s=60))
        chat = store.create_chat("remote tools", ChatSettings(max_new_tokens=40, temperature=0.0, system_prompt="",
                                                              stop_strings=("Done:",), tools=("calc/add",)))
        session = ChatSession(store, chat.id, backend, tools=hub)
        session.approver = approve
        session.send("What is 2 + 3?")
        await wait_until(lambda: session.task.done(), 120, "the reply")
        reply = session.messages[-1]
        calls = session.trace.calls(reply.id)
        await hub.close()
        await backend.close()
        return reply, calls

    reply, calls = run(loop, body(), 200)
    assert reply.stats.state == "done", reply.stats
    assert asked == [("calc/add", {"a": 2, "b": 3})]  # the same approval path as a local chat
    (call,) = calls
    assert (call.server, call.name, call.state, call.result) == ("calc", "add", "done", "5")
    assert json.loads(call.arguments) == {"a": 2, "b": 3} and call.preface == "Let me add."
    assert call.arguments == "".join(ARGS)  # the streamed pieces, put together as the model wrote them
    assert reply.content == ANSWER  # only there if the template saw the MCP result in a tool message
    # both rounds' tokens add up: the script's tokens once ("Done:" is round 1's, where the stop string ends it)
    # and the end token of round 2
    assert reply.stats.new_tokens == len(SCRIPT) + 1


def test_a_denied_call_goes_back_to_the_model_as_a_refusal(server, qtbot, loop, store, tmp_path):  # noqa: F811
    async def deny(request):
        return Approval(False)

    async def body():
        backend = RemoteBackend(server.url)
        await backend.connect()
        hub = ToolHub(tmp_path / "mcp.json", McpManager({"calc": calc_stdio()}, call_timeout_s=60))
        chat = store.create_chat("denied", ChatSettings(max_new_tokens=12, temperature=0.0, system_prompt="",
                                                        stop_strings=("Done:",), tools=("calc/add",)))
        session = ChatSession(store, chat.id, backend, tools=hub)
        session.approver = deny
        session.send("What is 2 + 3?")
        await wait_until(lambda: session.task.done(), 120, "the reply")
        reply = session.messages[-1]
        calls = session.trace.calls(reply.id)
        await hub.close()
        await backend.close()
        return reply, calls

    reply, calls = run(loop, body(), 200)
    assert [c.state for c in calls[:1]] == ["denied"]
    assert ANSWER not in reply.content  # the template never saw a result of 5: no answer from the script


def test_streamed_call_pieces_are_put_together_by_index():
    calls: dict[int, dict] = {}
    for piece in [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "add", "arguments": ""}},
                  {"index": 1, "id": "call_b", "type": "function", "function": {"name": "now", "arguments": "{}"}},
                  {"index": 0, "function": {"arguments": '{"a": 2, '}},
                  {"index": 0, "function": {"arguments": '"b": 3}'}}]:
        add_piece(calls, piece)
    assert calls == {0: {"id": "call_a", "name": "add", "arguments": '{"a": 2, "b": 3}'},
                     1: {"id": "call_b", "name": "now", "arguments": "{}"}}


def test_the_request_carries_tools_and_history_calls_as_the_openai_api_takes_them():
    spec = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    history = [{"role": "user", "content": "2+3?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
               {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "5"}]
    named = {"type": "function", "function": {"name": "add"}}
    body = chat_body("m", history, ChatSettings(system_prompt=""), [spec], named)
    assert body["tools"] == [spec]
    assert json.loads(body["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "5"}
    assert body["tool_choice"] == "none"  # a forced call was made: the round after its result answers
    assert round_tool_choice("required", history[:1]) == "required" and round_tool_choice("auto", history) == "auto"
    assert "tools" not in chat_body("m", history[:1], ChatSettings(system_prompt=""))
    thought = [{"role": "user", "content": "2+3?"},
               {**history[1], "reasoning_content": "add them"}, history[2],
               {"role": "assistant", "content": "5", "reasoning_content": "easy"}]
    sent = chat_body("m", thought, ChatSettings(system_prompt=""), [spec])["messages"]
    # thinking goes back with its tool round (a template may keep it for the turn), never with an answer
    assert sent[1]["reasoning_content"] == "add them" and sent[3] == {"role": "assistant", "content": "5"}

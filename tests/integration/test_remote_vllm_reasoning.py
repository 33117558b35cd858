"""Reasoning through a real vLLM CPU server: what can be tested with the default model, and what cannot.

SmolLM2 has no think tokens. vLLM's deepseek_r1 reasoning parser refuses to start without them ("could
not locate think start/end tokens in the tokenizer"); its qwen3 parser starts, and since Qwen3's
templates open the think block in the prompt, it takes a reply as thinking until the model writes
`</think>`, which SmolLM2 never does: the whole reply comes as vLLM's `reasoning` deltas (the newer name
of `reasoning_content`) and no `content`. That is what this module checks, on a second vLLM started with
`--reasoning-parser qwen3` (the main one has none, so its replies stay content): a remote chat shows such
a reply as its thinking, keeps it out of the answer, and does not send it back in the next turn.

Not tested (no model here can do it): a reply split by vLLM into thinking and an answer. Forcing
SmolLM2's text to write `</think>` is not possible either, as vLLM applies structured outputs only after
the reasoning has ended. The split itself is tested against pagedeck's own server, which sends
`reasoning_content` the same way (tests/app/test_remote_thinking.py).
"""
from __future__ import annotations

import pytest

from app.agent.reply_rounds import prompt_history, reply_view
from app.chat.chat_session import ChatSession
from app.core.remote_backend import RemoteBackend, chat_body
from app.core.store import ChatSettings
from tests.app.support import loop, run, store, wait_until  # noqa: F401
from tools.peers import vllm_server
from tools.processes import free_port, stop, wait_healthy

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def reasoning_url():
    port = free_port()
    proc = vllm_server.start(port, ("--reasoning-parser", "qwen3"), log_name="server-reasoning.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, vllm_server.START_TIMEOUT_S)
        yield url
    finally:
        stop(proc)


def test_a_reply_vllm_calls_reasoning_is_the_chats_thinking(reasoning_url, qtbot, loop, store):  # noqa: F811
    async def body():
        backend = RemoteBackend(reasoning_url)
        await backend.connect()
        chat = store.create_chat("vllm thinking", ChatSettings(max_new_tokens=24, temperature=0.0, system_prompt=""))
        session = ChatSession(store, chat.id, backend)
        try:
            session.send("What is the capital of France?")
            await wait_until(lambda: session.task.done(), 600, "the reply")
            reply = session.messages[-1]
            history = prompt_history(session.messages, session.trace.calls, None, backend.runs_tools)
            return reply, chat_body(backend.model, history, session.settings)["messages"]
        finally:
            await backend.close()

    reply, sent = run(loop, body(), 800)
    assert reply.stats.state == "done", reply.stats
    thinking, answer = reply_view(reply.content, [], None)
    assert "Paris" in thinking and answer.strip() == ""  # all of it came as vLLM's reasoning deltas
    assert reply.content.startswith("<think>") and reply.stats.new_tokens > 3
    assert sent[-1] == {"role": "assistant", "content": ""}  # the thinking is not sent back

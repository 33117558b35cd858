"""A remote server's reasoning_content (pagedeck's own server, as vLLM sends it) is shown as the chat's
thinking, and not sent back in the next turn. The model is a scripted tiny model (tests/scripted_models.py):
its greedy reply is a thought and an answer, in a template with Qwen3's think markers."""
from __future__ import annotations

import pytest

from app.agent.reply_rounds import prompt_history, reply_view
from app.chat.chat_session import ChatSession
from app.core.remote_backend import RemoteBackend, chat_body
from app.core.store import ChatSettings
from tests.app.support import loop, run, store, wait_until  # noqa: F401
from tests.scripted_models import write_scripted_model
from tests.server_support import ServerThread

pytestmark = pytest.mark.timeout(300)

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
            "{% if m.role == 'assistant' and '</think>' in m.content %}{{ m.content.split('</think>')[-1] }}"
            "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_remote_reply_s_reasoning_content_is_its_thinking(qtbot, loop, store, tmp_path):  # noqa: F811
    folder = write_scripted_model(tmp_path / "thinker", ["<think>", "pondering", "</think>", "answer"], TEMPLATE)

    async def body(url):
        backend = RemoteBackend(url)
        await backend.connect()
        chat = store.create_chat("remote", ChatSettings(max_new_tokens=16, temperature=0.0, system_prompt=""))
        session = ChatSession(store, chat.id, backend)
        session.send("hi")
        await wait_until(lambda: session.task.done(), 120, "the reply")
        reply = session.messages[-1]
        assert reply.stats.state == "done", reply.stats
        reasoning, shown = reply_view(reply.content, [], None)
        assert reasoning.strip() == "pondering" and shown.strip() == "answer", reply.content
        history = prompt_history(session.messages, session.trace.calls, None, backend.runs_tools)
        sent = chat_body(backend.model, history, session.settings)["messages"]
        assert sent[-1] == {"role": "assistant", "content": "answer"}  # the next turn sends no thinking back
        await backend.close()

    with ServerThread(folder, cache_tokens=1024, page_size=16) as server:
        run(loop, body(server.url))

"""Eight chats of a thinking model, each thinking for well over 1024 tokens, at once, on a cache that holds
fewer than three such replies: with the app's default (no reply limit: until the context is full) and pages
taken as replies grow, every chat thinks to its end and answers; none is cut at 1024 tokens, none fails for
lack of pages (the engine preempts and resumes), and no page stays referenced. The thinking text is forced
(a ChoiceFilter per reply, tests.app.test_mcp_chat's ScriptedService); the window, the engine service, the
scheduler and the thinking split are the real ones."""
from __future__ import annotations

import pytest

from app.core.reply_trace import ReplyTrace
from app.core.store import ChatSettings
from tests.app.support import loop, make_window, run, store, wait_until  # noqa: F401
from tests.app.test_mcp_chat import ScriptedService
from tests.tiny_models import write_tiny_model

pytestmark = pytest.mark.timeout(600)

CHATS = 8
THOUGHT = "<think>" + " ".join(f"step {i} checks case {i % 7}." for i in range(115)) + "</think>The answer is 42."
CACHE_TOKENS = 3072  # 12 pages of 256: two and a bit of these replies


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    """A tiny Qwen3 with a 2048-token context (the shared tiny model's 512 can't hold such a thought)."""
    return write_tiny_model(tmp_path_factory.mktemp("thinker"), "qwen3", max_position_embeddings=2048)


def test_eight_chats_each_think_past_1024_tokens(qtbot, loop, store, thinker):
    async def body():
        service = ScriptedService([THOUGHT] * CHATS)
        assert await service.load({"path": str(thinker), "cache_tokens": CACHE_TOKENS})
        window = make_window(qtbot, store, service)
        panes = [window.new_chat(f"think {i}") for i in range(CHATS)]
        for i, pane in enumerate(panes):
            pane.session.set_settings(ChatSettings(seed=1))  # the app's default: no reply limit
            assert pane.session.settings.max_new_tokens is None
            pane.send(f"Think case {i} through.")  # prompts differ, so no two replies share a page
        await wait_until(lambda: all(p.session.task is not None and p.session.task.done() and not p.session.running
                                     for p in panes), 500, "every chat's reply")
        trace = ReplyTrace(store)
        m = service.generator.metrics()
        for pane in panes:
            reply = pane.session.messages[-1]
            assert reply.stats.state == "done", reply.stats
            assert reply.content.endswith("The answer is 42."), reply.content[-80:]
            thought = trace.thinking(reply.id)
            assert thought is not None and thought.tokens > 1024, thought
        assert m["preemptions_total"] > 0  # the cache could not hold them all at once
        assert m["pages_referenced"] == 0  # every reply's pages given back (cached pages stay, by hash)
        await service.close()

    run(loop, body(), 540)

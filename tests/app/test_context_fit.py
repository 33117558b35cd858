"""fit_context with a reply that has no limit (ChatSettings.max_new_tokens None, the default): the reply gets
all the room the prompt leaves, and old turns are dropped only to leave it REPLY_ROOM tokens."""
from __future__ import annotations

from app.core.context import REPLY_ROOM, fit_context
from app.core.remote_backend import chat_body
from app.core.store import ChatSettings


def history(turns: int) -> list[dict]:
    out = []
    for i in range(turns):
        out += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    return out + [{"role": "user", "content": "last"}]


def count(h, s):
    return 500 * len(h)  # every message 500 tokens


def test_default_reply_fills_the_context():
    settings = ChatSettings()
    assert settings.max_new_tokens is None
    fit = fit_context(history(2), settings, count, 8192)  # 5 messages: 2500 tokens
    assert fit.dropped == 0 and fit.max_new_tokens == 8192 - 2500


def test_unlimited_reply_drops_turns_only_to_keep_its_room():
    fit = fit_context(history(7), ChatSettings(), count, 8192)  # 15 messages: 7500 tokens, 692 left
    assert 8192 - fit.prompt_tokens >= REPLY_ROOM and fit.dropped == 2  # one turn: 1692 left
    assert fit.max_new_tokens == 8192 - fit.prompt_tokens
    limited = fit_context(history(7), ChatSettings(max_new_tokens=3000), count, 8192)
    assert limited.max_new_tokens == 3000 and limited.dropped == 6


def test_remote_request_names_no_limit_unless_the_chat_has_one():
    assert "max_tokens" not in chat_body("m", history(0), ChatSettings())
    assert chat_body("m", history(0), ChatSettings(max_new_tokens=64))["max_tokens"] == 64

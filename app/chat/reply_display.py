"""What the transcript shows of a stored message: a reply's thinking apart, folded into one line (with its
token count and time) unless opened, and its tool rounds as blocks above its answer."""
from __future__ import annotations

from dataclasses import replace

from app.agent.reply_rounds import reply_view
from app.agent.tool_hub import ToolHub
from app.chat.chat_session import ChatSession
from app.core.store import Message


def thinking_label(tokens: int | None, seconds: float | None) -> str:
    if tokens is None:
        return "Thoughts"
    return f"Thought for {seconds:.1f} s · {tokens} tokens"


def shown(session: ChatSession, message: Message, expanded: set[int]) -> tuple[Message, tuple[str, str, bool] | None]:
    """(the message with the Markdown to show as its content, its thinking section or None)."""
    if message.role != "assistant":
        return message, None
    tools = ToolHub.names_seen(session.settings.tools) if session.backend.runs_tools else ()
    reasoning, markdown = reply_view(message.content, session.trace.calls(message.id),
                                     session.backend.chat_template(session.settings), tools)
    thinking = None
    if reasoning:
        t = session.trace.thinking(message.id)
        thinking = (thinking_label(t.tokens if t else None, t.seconds if t else None), reasoning, message.id in expanded)
    return replace(message, content=markdown), thinking

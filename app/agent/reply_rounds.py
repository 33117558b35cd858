"""A reply as rounds: the model's text split into thinking, answer and tool calls, and back into messages.

A reply that calls tools is several model rounds: each round's text may open with thinking, may say
something, and ends in calls (in the model's own format, read off its chat template); the round after
the calls' results is the next. RoundParser splits one round while it streams (the thinking apart, never
half a call shown). The same split of stored replies gives what a chat shows (`reply_view`: the thinking,
then each round's text and its calls as blocks, then the answer) and what later prompts hold
(`prompt_history`): thinking goes back as `reasoning_content`, which a template renders only where it
asks for it (Qwen3's keeps it for the current turn's tool rounds) and every other template ignores, so
earlier turns' thinking is never sent back unless the template wants it.
"""
from __future__ import annotations

import json
from itertools import groupby
from typing import Callable, Iterable

from app.core.reply_trace import ToolCallRecord
from app.core.store import Message
from engine.chat import THINK, ReasoningMarkers, ReplyParser, ToolCall, reasoning_markers, split_reasoning, split_reply
from engine.chat import starts_in_reasoning, supports_thinking_switch, tool_call_format
from engine.chat.harmony import uses_harmony

MAX_ROUNDS = 8  # model rounds per reply: a model that keeps calling tools is stopped with its last text
RESULT_SHOWN_CHARS = 2000  # a tool result longer than this is cut in the transcript (the model gets it whole)

__all__ = ["MAX_ROUNDS", "RoundParser", "ToolCall", "markers_of", "prompt_history", "reply_view", "rounds_of",
           "takes_effort", "thinks", "tool_block"]


def markers_of(template: str | None) -> ReasoningMarkers:
    """The thinking markers of a template; `<think>` where it names none (a reply is split only when it
    starts with one, so a model without thinking is unaffected)."""
    return reasoning_markers(template) or THINK


def thinks(template: str | None) -> bool:
    """Whether the template has the thinking switch (the chat's "thinking" setting applies)."""
    return supports_thinking_switch(template)


def takes_effort(template: str | None) -> bool:
    """Whether the model takes a reasoning effort (a harmony template: the chat's reasoning_effort applies)."""
    return uses_harmony(template)


class RoundParser(ReplyParser):
    """One round of a streaming reply (engine.chat's ReplyParser): raw text in; thinking, answer text and
    complete calls out. `<think>` is split where the template names no markers too (only at the reply's
    start), and calls are parsed only when the chat has tools: `tool_names`, the names the model sees
    (calls in the template's format, and plain JSON naming one of them, as small models write calls)."""

    def __init__(self, template: str | None, prompt: str | None = None, tool_names: Iterable[str] = ()):
        markers = markers_of(template)
        names = tuple(tool_names)
        super().__init__(markers, in_reasoning=starts_in_reasoning(prompt or "", markers),
                         tool_format=tool_call_format(template) if names else None, tool_names=names)


def _fence(text: str) -> str:
    longest = max((len(run) for run in text.split("\n") if set(run) == {"`"}), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}text\n{text}\n{ticks}"


def tool_block(record: ToolCallRecord) -> str:
    """A call and its result as a Markdown block of its own: a line naming it, the result fenced below."""
    verdict = {"done": "Tool call", "denied": "Tool call not allowed", "error": "Tool call failed"}.get(
        record.state, f"Tool call ({record.state})")
    args = json.dumps(record.arguments_dict(), ensure_ascii=False) if record.arguments_dict() else record.arguments
    result = record.result if len(record.result) <= RESULT_SHOWN_CHARS else (
        record.result[:RESULT_SHOWN_CHARS] + f"\n… ({len(record.result) - RESULT_SHOWN_CHARS} more characters)")
    return f"**{verdict}** {record.name} · {record.server} · `{args or '{}'}`\n\n{_fence(result or '(empty)')}"


def rounds_of(calls: list[ToolCallRecord]) -> list[list[ToolCallRecord]]:
    return [list(g) for _, g in groupby(calls, key=lambda c: c.round)]


def rounds_markdown(calls: list[ToolCallRecord]) -> str:
    """The tool rounds' text and call blocks, as the transcript shows them before the answer."""
    parts = []
    for calls_of_round in rounds_of(calls):
        if calls_of_round[0].preface.strip():
            parts.append(calls_of_round[0].preface.strip())
        parts += [tool_block(c) for c in calls_of_round]
    return "".join(p + "\n\n" for p in parts)


def reply_view(content: str, calls: list[ToolCallRecord], template: str | None,
               tool_names: Iterable[str] = ()) -> tuple[str, str]:
    """(thinking, Markdown) of a stored reply: the rounds' thinking joined; their text and calls, then the
    answer. Calls left in the answer's text (a reply stopped mid-call, or at the round limit) are not shown
    as text, as they were not while it streamed: `tool_names`, the functions the chat offers, make plain
    JSON naming one of them (fenced or bare, as small models write calls) a call here too."""
    names = {*tool_names, *(c.name for c in calls)}
    final = split_reply(content, markers_of(template), tool_format=tool_call_format(template), tool_names=names)
    reasoning, answer = final.reasoning, final.content
    thoughts = [c[0].reasoning for c in rounds_of(calls) if c[0].reasoning] + ([reasoning] if reasoning else [])
    return "\n\n".join(thoughts), rounds_markdown(calls) + answer


def _assistant(content: str, reasoning: str) -> dict:
    msg = {"role": "assistant", "content": content}
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


def round_messages(calls_of_round: list[ToolCallRecord]) -> list[dict]:
    """One tool round as chat messages: the assistant's calls, then each call's result as a tool message."""
    first = calls_of_round[0]
    msg = _assistant(first.preface, first.reasoning)
    msg["tool_calls"] = [{"id": c.call_id, "type": "function",
                          "function": {"name": c.name, "arguments": c.arguments_dict()}} for c in calls_of_round]
    results = [{"role": "tool", "tool_call_id": c.call_id, "name": c.name,
                "content": c.result if c.state == "done" else f"error: {c.result}"} for c in calls_of_round]
    return [msg, *results]


def prompt_history(messages: list[Message], calls_of: Callable[[int], list[ToolCallRecord]], template: str | None,
                   with_tools: bool) -> list[dict]:
    """The chat as template messages. A reply's thinking goes as reasoning_content (see the module
    docstring); its tool rounds as calls and results where the backend runs tools, else as plain text."""
    markers = markers_of(template)
    out: list[dict] = []
    for m in messages:
        if m.role != "assistant":
            out.append({"role": m.role, "content": m.content})
            continue
        calls = calls_of(m.id)
        reasoning, answer = split_reasoning(m.content, markers)
        if with_tools:
            for calls_of_round in rounds_of(calls):
                out += round_messages(calls_of_round)
            out.append(_assistant(answer, reasoning))
        else:
            out.append({"role": "assistant", "content": rounds_markdown(calls) + answer})
    return out

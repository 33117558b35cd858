"""OpenAI chat messages (tool calls and results included) made renderable by any model's chat template.

Templates that know tools (Qwen, Llama 3.x, Mistral) render `tools`, assistant `tool_calls` and
`role: "tool"` messages themselves; they get the messages as transformers and vLLM hand them over:
each call's `arguments` as an object rather than OpenAI's JSON text (the templates apply `tojson` to
it), and None content as "". Templates that know none (SmolLM2, Gemma, Phi-3.5) would drop the tools
and fail on the rest, so for them the tool list becomes a system prompt in the Hermes format (the one
most small models were tuned on, the format the fallback parser reads), earlier calls become the
assistant's text in the model's call format, and tool results become user turns wrapped in
`<tool_response>` tags (Qwen3's own convention), consecutive results merged into one turn so templates
that insist on alternating roles accept them.

A previous reply's `reasoning_content` is passed on as the message field of that name: templates that
keep thinking in the history (Qwen3, inside a tool-calling turn) render it, the others ignore it.
"""
from __future__ import annotations

import json
from typing import Any

from .tool_calls import ToolCall, ToolCallFormat

TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>"
)


def template_knows_tools(template: str | None) -> bool:
    """Whether the template renders a `tools` list (else the fallback system prompt carries it)."""
    return bool(template) and "tools" in template


def template_knows_tool_calls(template: str | None) -> bool:
    """Whether the template renders assistant `tool_calls` and `tool` messages itself."""
    return bool(template) and "tool_calls" in template


def tools_system_prompt(tools: list[dict]) -> str:
    """The Hermes-style tool prompt for templates that have none."""
    return TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments  # the template renders the text as it is
    return arguments


def template_messages(messages: list[dict], template: str | None, fmt: ToolCallFormat,
                      tools: list[dict] | None = None) -> list[dict]:
    """The messages to render with `template` (see the module docstring). Messages are OpenAI-shaped
    dicts: role, content (str or None), and optionally tool_calls, tool_call_id, name, reasoning_content.
    The input is not modified."""
    native = template_knows_tool_calls(template) or fmt.name == "harmony"  # (harmony_render takes them as they are)
    out: list[dict] = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        calls = m.get("tool_calls")
        if m["role"] == "assistant" and calls:
            if native:
                m["tool_calls"] = [{**c, "function": {**c["function"],
                                                      "arguments": _arguments_object(c["function"]["arguments"])}}
                                   for c in calls]
            else:
                text = fmt.render([ToolCall.from_openai(c) for c in calls])
                m.pop("tool_calls")
                m["content"] = (m["content"] + "\n" + text) if m["content"] else text
        elif m["role"] == "tool" and not native:
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
                continue
            m = {"role": "user", "content": block, "_tool_results": True}
        out.append(m)
    for m in out:
        m.pop("_tool_results", None)
    if tools and not template_knows_tools(template) and fmt.name != "harmony":  # (harmony_render writes its own)
        prompt = tools_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def render_kwargs(tools: list[dict] | None, template: str | None, **extra: Any) -> dict:
    """apply_chat_template keyword arguments: `tools` for templates that render them, plus `extra`
    (e.g. enable_thinking) with None values left out so the template's own defaults apply."""
    kwargs = {k: v for k, v in extra.items() if v is not None}
    if tools and template_knows_tools(template):
        kwargs["tools"] = tools
    return kwargs

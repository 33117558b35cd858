"""The tools and reasoning part of an OpenAI chat request: checked, then turned into a plan for the job.

Accepted: `tools` (function tools), `tool_choice` ("none", "auto", "required", or one named function),
`parallel_tool_calls`; history with assistant `tool_calls` and `role: "tool"` results (and a previous
reply's `reasoning_content`); vLLM's `chat_template_kwargs` (e.g. {"enable_thinking": false} for Qwen3)
and `include_reasoning` (false: the reply's thinking stays in `content` as raw text); `reasoning_effort`
("low", "medium" or "high": a harmony model's (gpt-oss) system message says it; other templates get it
as the template variable of that name, which most ignore).

A harmony model's reply is always read by its channels (engine.chat.harmony_parser): its analysis
channel is `reasoning_content` (include_reasoning cannot turn it into content: it never was text of
the answer), its final channel `content`, its commentary calls `tool_calls`.

How each choice is served:
- "none": the tools are left out of the prompt and the reply is plain text (OpenAI: no calls);
- "auto": the tools are in the prompt, and calls the model writes in its format become `tool_calls`, as
  do plain JSON calls of an offered function (fenced or bare, ending the reply: engine.chat.
  json_tool_calls), which small models write instead of their format's markers;
- "required" / named: as auto, plus a grammar (engine.chat.tool_choice_grammar) that only lets the
  model write a valid call (of that function), so the reply always parses and its arguments validate.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..chat import (
    ReasoningMarkers, ToolCallFormat, reasoning_markers, render_kwargs, starts_in_reasoning, template_messages,
    tool_call_format, tool_choice_grammar,
)
from ..chat.harmony import check_reasoning_effort
from ..chat.reasoning import HARMONY
from ..chat.tool_calls import FORMATS
from ..generator.filters import GrammarFilter
from .errors import bad_request

TOOL_FIELDS = {"tools", "tool_choice", "parallel_tool_calls", "include_reasoning", "chat_template_kwargs",
               "reasoning_effort"}
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
_NAME = re.compile(TOOL_NAME_PATTERN)
# variables a request may not set through chat_template_kwargs: the server renders these itself
RESERVED_KWARGS = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "documents"}


@dataclass
class ToolPlan:
    """What the request asks beyond plain text: the tools, the choice, and how to read the reply."""

    tools: list[dict] | None  # the tools rendered into the prompt (None: none)
    choice: str  # "none" | "auto" | "required" | a function name
    parallel: bool
    tool_format: ToolCallFormat | None  # parse calls in this format (None: the reply is text)
    markers: ReasoningMarkers | None  # split reasoning with these (None: raw text)
    template_kwargs: dict
    in_reasoning: bool = False  # set once the prompt is rendered
    decode_special: bool = False  # a marker is a special token: the job must decode special tokens

    @property
    def forced(self) -> bool:
        return self.choice not in ("none", "auto")

    @property
    def tool_names(self) -> frozenset[str]:
        """The offered functions' names (a reply's plain JSON naming one of them is a call)."""
        return frozenset(t["function"]["name"] for t in self.tools or ())


def parse_tool_plan(body: dict, tokenizer: Any) -> ToolPlan:
    template = tokenizer.chat_template
    tools = _tools(body.get("tools"))
    choice = _choice(body.get("tool_choice"), tools)
    parallel = _bool(body, "parallel_tool_calls", True)
    include_reasoning = _bool(body, "include_reasoning", True)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and (not isinstance(kwargs, dict) or set(kwargs) & RESERVED_KWARGS
                               or not all(isinstance(k, str) for k in kwargs)):
        raise bad_request("chat_template_kwargs must be an object of template variables (not "
                          f"{', '.join(sorted(RESERVED_KWARGS))})", "chat_template_kwargs")
    kwargs = dict(kwargs or {})
    effort = body.get("reasoning_effort")
    if effort is not None:
        try:
            kwargs["reasoning_effort"] = check_reasoning_effort(effort)
        except ValueError as exc:
            raise bad_request(str(exc), "reasoning_effort") from None
    harmony = _harmony(tokenizer)
    fmt = (FORMATS["harmony"] if harmony else tool_call_format(template)) if tools and choice != "none" else None
    markers = HARMONY if harmony else reasoning_markers(template) if include_reasoning else None
    plan = ToolPlan(tools if fmt is not None else None, choice, parallel, fmt, markers, kwargs)
    special = tokenizer.special_token_ids
    plan.decode_special = any(tokenizer.token_to_id(m) in special for m in _markers(plan))
    return plan


def _harmony(tokenizer: Any) -> bool:
    """Whether the model's chats are harmony (its chat format says so, or its template writes it)."""
    chat_format = getattr(tokenizer, "chat_format", None)
    return bool(getattr(chat_format, "harmony", False)) or reasoning_markers(tokenizer.chat_template) is HARMONY


def _markers(plan: ToolPlan) -> list[str]:
    out = list(plan.tool_format.markers) if plan.tool_format is not None else []
    if plan.markers is not None:
        out += [plan.markers.start, plan.markers.end]
    return out


def render_prompt(plan: ToolPlan, messages: list[dict], tokenizer: Any) -> str:
    """The chat prompt: messages made renderable by the model's template, tools and template kwargs passed."""
    template = tokenizer.chat_template
    harmony = plan.markers is HARMONY  # (also a harmony vocabulary with no template: its tools go to the renderer)
    # history calls still render in the model's format
    fmt = plan.tool_format or (FORMATS["harmony"] if harmony else tool_call_format(template))
    prepared = template_messages(messages, template, fmt, plan.tools)
    kwargs = render_kwargs(plan.tools, template, **plan.template_kwargs)
    if harmony and plan.tools:
        kwargs["tools"] = plan.tools
    try:
        prompt = tokenizer.apply_chat_template(prepared, add_generation_prompt=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - jinja2 raise_exception(), bad role order, ...
        raise bad_request(f"the model's chat template rejected the messages: {exc}", "messages",
                          "chat_template_error") from None
    plan.in_reasoning = starts_in_reasoning(prompt, plan.markers)
    return prompt


def tool_filters(plan: ToolPlan, tokenizer: Any) -> list:
    """The grammar filter of a required / named choice ([] otherwise)."""
    if not plan.forced:
        return []
    special = {m: i for m in _markers(plan)
               if (i := tokenizer.token_to_id(m)) is not None and i in tokenizer.special_token_ids}
    try:
        grammar = tool_choice_grammar(plan.tool_format, plan.tools, plan.choice, parallel=plan.parallel,
                                      special_tokens=special, reasoning=plan.markers, in_reasoning=plan.in_reasoning)
        return [GrammarFilter(grammar)]
    except ValueError as exc:  # a parameters schema llguidance can't compile
        raise bad_request(f"cannot constrain the reply to the tool's parameters: {exc}", "tools",
                          "invalid_json_schema") from None


# ---- field checks ------------------------------------------------------------------------------------
def _tools(tools: Any) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of {\"type\": \"function\", \"function\": {...}} objects", "tools")
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise bad_request(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}} (only function "
                              "tools are supported)", where)
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_request(f"{where}.function.name must be 1-64 letters, digits, _ . : or -, got {name!r}",
                              f"{where}.function.name")
        if name in names:
            raise bad_request(f"{where}: function {name!r} is listed twice", f"{where}.function.name",
                              "duplicate_tool_name")
        names.add(name)
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise bad_request(f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters")
        if "description" in fn and not isinstance(fn["description"], str):
            raise bad_request(f"{where}.function.description must be a string", f"{where}.function.description")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise bad_request(f"{where}.function.strict must be true or false", f"{where}.function.strict")
    return tools or None


def _choice(choice: Any, tools: list[dict] | None) -> str:
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise bad_request(f"tool_choice must be none, auto, required or {{\"type\": \"function\", \"function\": "
                              f"{{\"name\": ...}}}}, got {choice!r}", "tool_choice")
        if choice != "none" and not tools:
            raise bad_request(f"tool_choice {choice!r} needs tools", "tool_choice")
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and choice.get("type") == "function" \
        and isinstance(choice.get("function"), dict) else None
    if not isinstance(name, str):
        raise bad_request("a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    if not tools or name not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"tool_choice names function {name!r}, which is not in tools", "tool_choice",
                          "tool_choice_not_in_tools")
    return name


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false, got {value!r}", name)
    return value


def check_tool_message(m: dict, where: str) -> dict:
    """The tool-related fields of one history message, checked: assistant tool_calls (content may then be
    null), a tool result's tool_call_id, a previous reply's reasoning_content."""
    out: dict = {}
    role = m.get("role")
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise bad_request(f"{where}.tool_calls is a list, on assistant messages only", f"{where}.tool_calls")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or c.get("type", "function") != \
                    "function" or not isinstance(fn.get("arguments", ""), (str, dict)) or \
                    not isinstance(c.get("id", ""), str):
                raise bad_request(f"{where}.tool_calls[{j}] must be {{\"id\", \"type\": \"function\", \"function\": "
                                  "{\"name\", \"arguments\"}}", f"{where}.tool_calls")
        out["tool_calls"] = [{"id": c.get("id", ""), "type": "function",
                              "function": {"name": c["function"]["name"],
                                           "arguments": c["function"].get("arguments", "{}")}} for c in calls]
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str):
            raise bad_request(f"{where}.tool_call_id (a string) is required on tool messages", f"{where}.tool_call_id")
        out["tool_call_id"] = call_id
    reasoning = m.get("reasoning_content")
    if reasoning is not None:
        if role != "assistant" or not isinstance(reasoning, str):
            raise bad_request(f"{where}.reasoning_content is a string, on assistant messages only",
                              f"{where}.reasoning_content")
        out["reasoning_content"] = reasoning
    return out

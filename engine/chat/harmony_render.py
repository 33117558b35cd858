"""OpenAI chat messages rendered as a harmony prompt (gpt-oss), with tools and the reasoning effort.

The conversation is built from the `openai-harmony` package's message types, then written as text here
(engine.chat.harmony says why not by its encoder); the model's tokenizer reads the special tokens in it.
The layout is the harmony guide's, as gpt-oss was trained on it:

- a system message: the model's identity, knowledge cutoff, the date, `Reasoning: {effort}` and the
  valid channels (plus where function calls go, when there are tools);
- a developer message: the chat's system prompt as `# Instructions`, the tools as a TypeScript
  `namespace functions` (each parameter from its JSON schema);
- user turns; earlier answers on the `final` channel (their thinking dropped, as the model expects);
  a turn's calls on the `commentary` channel `to=functions.NAME <|constrain|>json`, each ending in
  `<|call|>`, with the thinking before them kept while the turn is still going (no answer after it);
  each result as a message from `functions.NAME` to the assistant;
- the generation prompt `<|start|>assistant`: the model writes its channel next.
"""
from __future__ import annotations

import json
from datetime import date
from typing import Any

from .harmony import CALL, CHANNEL, DEFAULT_REASONING_EFFORT, END, MESSAGE, START, check_reasoning_effort

JSON_CALL = "<|constrain|>json"  # a call's content type: its arguments are JSON


def _text(content: Any) -> str:
    """A message's content as text (a list of parts: its text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def _arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


# ---- tools as TypeScript ------------------------------------------------------------------------------
def _ts_type(schema: Any) -> str:
    """A JSON schema as the TypeScript type the harmony guide writes for it."""
    if not isinstance(schema, dict):
        return "any"
    if "enum" in schema:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    for key in ("oneOf", "anyOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(_ts_type(s) for s in schema[key])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_ts_type({**schema, "type": k}) for k in kind)
    if kind == "array":
        inner = _ts_type(schema.get("items"))
        return (f"({inner})" if "|" in inner else inner) + "[]"
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return "object"
        return "{\n" + _ts_fields(props, schema.get("required") or []) + "}"
    return {"string": "string", "number": "number", "integer": "number", "boolean": "boolean",
            "null": "null"}.get(kind, "any")


def _ts_fields(props: dict, required: list) -> str:
    out = []
    for name, spec in props.items():
        spec = spec if isinstance(spec, dict) else {}
        if spec.get("description"):
            out.append(f"// {spec['description']}\n")
        line = f"{name}{'' if name in required else '?'}: {_ts_type(spec)},"
        if "default" in spec:
            line += f" // default: {json.dumps(spec['default'], ensure_ascii=False)}"
        out.append(line + "\n")
    return "".join(out)


def _namespace(tools: list) -> str:
    """The function tools as harmony's `namespace functions { ... }` block."""
    out = ["## functions\n\nnamespace functions {\n\n"]
    for tool in tools:
        if tool.description:
            out.append(f"// {tool.description}\n")
        params = tool.parameters or {}
        if isinstance(params.get("properties"), dict) and params["properties"]:
            out.append(f"type {tool.name} = (_: {{\n{_ts_fields(params['properties'], params.get('required') or [])}"
                       "}) => any;\n\n")
        else:
            out.append(f"type {tool.name} = () => any;\n\n")
    out.append("} // namespace functions")
    return "".join(out)


# ---- messages -------------------------------------------------------------------------------------------
def _system_text(system: Any) -> str:
    lines = []
    if system.model_identity:
        lines.append(system.model_identity)
    if system.knowledge_cutoff:
        lines.append(f"Knowledge cutoff: {system.knowledge_cutoff}")
    if system.conversation_start_date:
        lines.append(f"Current date: {system.conversation_start_date}")
    parts = ["\n".join(lines)] if lines else []
    if system.reasoning_effort is not None:
        parts.append(f"Reasoning: {system.reasoning_effort.value.lower()}")
    if system.channel_config is not None:
        parts.append(f"# Valid channels: {', '.join(system.channel_config.valid_channels)}. "
                     "Channel must be included for every message.")
    return "\n\n".join(parts)


def _developer_text(developer: Any) -> str:
    parts = []
    if developer.instructions:
        parts.append(f"# Instructions\n\n{developer.instructions}")
    if developer.tools:
        parts.append("# Tools\n\n" + "\n\n".join(_namespace(ns.tools) for ns in developer.tools.values()))
    return "\n\n".join(parts)


def _render_message(msg: Any, *, has_functions: bool = False) -> str:
    """One harmony message as text: header, content, and its closing token (`<|call|>` for a call)."""
    from openai_harmony import DeveloperContent, Role, SystemContent, TextContent

    body = []
    for c in msg.content:
        if isinstance(c, SystemContent):
            text = _system_text(c)
            if has_functions:
                text += "\nCalls to these tools must go to the commentary channel: 'functions'."
            body.append(text)
        elif isinstance(c, DeveloperContent):
            body.append(_developer_text(c))
        elif isinstance(c, TextContent):
            body.append(c.text)
    role = msg.author.role
    header = msg.author.name if role == Role.TOOL and msg.author.name else role.value
    if role == Role.TOOL and msg.recipient:
        header += f" to={msg.recipient}"
    if msg.channel:
        header += f"{CHANNEL}{msg.channel}"
    if role != Role.TOOL and msg.recipient:
        header += f" to={msg.recipient}"
    if msg.content_type:
        header += f" {msg.content_type}"
    calls = role == Role.ASSISTANT and (msg.recipient or "").startswith("functions.")
    return f"{START}{header}{MESSAGE}{''.join(body)}{CALL if calls else END}"


def harmony_messages(messages: list[dict], *, tools: list[dict] | None = None, reasoning_effort: str | None = None,
                     model_identity: str | None = None, current_date: str | None = None) -> list:
    """OpenAI-shaped messages (tool calls and results, reasoning_content included) as openai_harmony
    Messages, the system and developer messages first (see the module docstring)."""
    from openai_harmony import (
        Author, DeveloperContent, Message, ReasoningEffort, Role, SystemContent, ToolDescription,
    )

    effort = check_reasoning_effort(reasoning_effort or DEFAULT_REASONING_EFFORT)
    system = SystemContent.new().with_reasoning_effort(ReasoningEffort(effort.capitalize())) \
        .with_conversation_start_date(current_date or date.today().isoformat())
    if model_identity:
        system = system.with_model_identity(model_identity)
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    rest = list(messages)
    developer = DeveloperContent.new()
    if rest and rest[0].get("role") in ("system", "developer"):
        developer = developer.with_instructions(_text(rest.pop(0).get("content")))
    functions = [t["function"] for t in tools or () if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    if functions:
        developer = developer.with_function_tools(
            [ToolDescription.new(f["name"], f.get("description") or "", f.get("parameters")) for f in functions])
    if developer.instructions or developer.tools:
        out.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    # the turn still going: its thinking before calls is kept (there is no answer after it yet)
    last_answer = max((i for i, m in enumerate(rest) if m.get("role") == "assistant" and not m.get("tool_calls")),
                      default=-1)
    names: dict[str, str] = {}  # call id -> function name, for the results
    last_call = ""
    for i, m in enumerate(rest):
        role, text = m.get("role"), _text(m.get("content"))
        if role == "user":
            out.append(Message.from_role_and_content(Role.USER, text))
        elif role in ("system", "developer"):
            out.append(Message.from_role_and_content(Role.DEVELOPER, text))
        elif role == "assistant" and m.get("tool_calls"):
            if m.get("reasoning_content") and i > last_answer:
                out.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning_content"]).with_channel("analysis"))
            if text.strip():  # what it said before calling: harmony's preamble
                out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary"))
            for call in m["tool_calls"]:
                fn = call.get("function") or {}
                last_call = names[str(call.get("id") or "")] = fn.get("name", "")
                out.append(Message.from_role_and_content(Role.ASSISTANT, _arguments(fn.get("arguments", "{}")))
                           .with_channel("commentary").with_recipient(f"functions.{last_call}")
                           .with_content_type(JSON_CALL))
        elif role == "assistant":
            out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final"))
        elif role == "tool":
            name = m.get("name") or names.get(str(m.get("tool_call_id") or ""), last_call)
            out.append(Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), text)
                       .with_channel("commentary").with_recipient("assistant"))
        else:
            raise ValueError(f"harmony has no role {role!r} (system, developer, user, assistant, tool)")
    return out


def render_harmony(messages: list[dict], add_generation_prompt: bool = True, *, tools: list[dict] | None = None,
                   reasoning_effort: str | None = None, model_identity: str | None = None,
                   current_date: str | None = None, **_template_kwargs: Any) -> str:
    """The harmony prompt of an OpenAI-shaped chat (other template variables a caller passes, such as
    enable_thinking, mean nothing to harmony and are ignored)."""
    conversation = harmony_messages(messages, tools=tools, reasoning_effort=reasoning_effort,
                                    model_identity=model_identity, current_date=current_date)
    text = "".join(_render_message(m, has_functions=bool(tools)) for m in conversation)
    return text + (f"{START}assistant" if add_generation_prompt else "")

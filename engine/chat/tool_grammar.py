"""The grammar that forces a tool call: OpenAI's tool_choice "required" or a named function.

The reply is constrained (llguidance, Lark syntax with embedded JSON schemas) to be one call, or one or
more when parallel calls are allowed, written in the model's own call format, with the arguments valid
under the function's `parameters` schema. So such a call always parses and validates, whatever the
model would have written. Markers that are single special tokens of the vocabulary (Llama's
`<|python_tag|>`, Mistral's `[TOOL_CALLS]`) are named by token id (`<[id]>`): text can't produce them.

A reasoning model may think first: the grammar lets a think block come before the calls (or, when the
prompt already opened one, requires its end), so forcing a call does not switch thinking off.
"""
from __future__ import annotations

import json
from typing import Any

from .reasoning import ReasoningMarkers
from .tool_calls import ToolCallFormat

# Fixed JSON layout: small models given free whitespace under greedy decoding loop on newlines.
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
EMPTY_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def function_name(tool: dict) -> str:
    return tool["function"]["name"]


def _parameters(tool: dict) -> dict:
    """The function's parameters schema; an object schema that doesn't say gets no properties beyond
    the listed ones (as OpenAI's strict mode): an argument the function doesn't declare can't be used."""
    params = tool["function"].get("parameters")
    if not isinstance(params, dict) or not params:
        return EMPTY_PARAMETERS
    if params.get("type") == "object" and "additionalProperties" not in params:
        params = {**params, "additionalProperties": False}
    return params


def _json(schema: Any) -> str:
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": _JSON_LAYOUT}
    return "%json" + json.dumps(schema, ensure_ascii=False)


def _call_object(tool: dict, args_key: str) -> dict:
    return {"type": "object", "properties": {"name": {"const": function_name(tool)}, args_key: _parameters(tool)},
            "required": ["name", args_key], "additionalProperties": False}


def tool_choice_grammar(fmt: ToolCallFormat, tools: list[dict], choice: str, *, parallel: bool = True,
                        special_tokens: dict[str, int] | None = None, reasoning: ReasoningMarkers | None = None,
                        in_reasoning: bool = False) -> str:
    """Lark grammar (llguidance dialect) of a reply that calls a tool.

    tools: OpenAI tool entries ({"type": "function", "function": {"name", "parameters"}}); choice:
    "required" (any of them) or one function's name; parallel: one or more calls, else exactly one
    (a named choice is always exactly one); special_tokens: marker text -> token id for the markers
    that are single special tokens; reasoning: the template's think markers (a think block may come
    first; in_reasoning: the prompt opened it, so the reply starts inside it).
    """
    chosen = tools if choice == "required" else [t for t in tools if function_name(t) == choice]
    if not chosen:
        raise ValueError(f"tool_choice names function {choice!r}, which is not in tools")
    special = special_tokens or {}

    def lit(text: str) -> str:
        return f"<[{special[text]}]>" if text in special else json.dumps(text, ensure_ascii=False)

    many = parallel and choice == "required"
    rules = _format_rules(fmt, chosen, lit, many)
    head = "start: calls\n"
    if reasoning is not None and fmt.name != "harmony":  # (harmony's thinking is a channel: the call comes first)  # the think text runs to its closing marker (llguidance's stop= lexeme)
        think = f'think_text[stop={json.dumps(reasoning.end)}]: /(.|\\n)*/\n'
        if in_reasoning:
            head = f"start: think_text /[ \\n]*/ calls\n{think}"
        else:
            head = (f"start: think? calls\nthink: /[ \\n]*/ {lit(reasoning.start)} think_text /[ \\n]*/\n"
                    f"{think}")
    return head + rules


def _format_rules(fmt: ToolCallFormat, chosen: list[dict], lit, many: bool) -> str:
    name = fmt.name
    if name == "hermes":
        schema = _any_of([_call_object(t, "arguments") for t in chosen])
        call = f'call: {lit("<tool_call>")} "\\n" {_json(schema)} "\\n" {lit("</tool_call>")}\n'
        return ('calls: call ("\\n" call)*\n' if many else "calls: call\n") + call
    if name == "llama3_json":
        schema = _any_of([_call_object(t, "parameters") for t in chosen])
        return ('calls: call ("; " call)*\n' if many else "calls: call\n") + f"call: {_json(schema)}\n"
    if name in ("mistral", "phi4_mini"):
        item = _any_of([_call_object(t, "arguments") for t in chosen])
        array = {"type": "array", "items": item, "minItems": 1, **({} if many else {"maxItems": 1})}
        trigger = fmt.triggers[0]
        marker = trigger[:-1] if trigger.endswith("[") else trigger
        return f"calls: {lit(marker)} {_json(array)}\n"
    if name == "mistral_args":
        alts = " | ".join(f"{json.dumps(function_name(t))} {lit('[ARGS]')} {_json(_parameters(t))}" for t in chosen)
        return ("calls: call+\n" if many else "calls: call\n") + f"call: {lit('[TOOL_CALLS]')} ({alts})\n"
    if name == "harmony":  # one call, its message's text its arguments; the stop token <|call|> ends it
        alts = " | ".join(f"{json.dumps(f'commentary to=functions.{function_name(t)} ')} {lit('<|constrain|>')} "
                          f"\"json\" {lit('<|message|>')} {_json(_parameters(t))}" for t in chosen)
        return f"calls: {lit('<|channel|>')} ({alts})\n"
    raise ValueError(f"no grammar for tool call format {name!r}")


def _any_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}

"""The JSON schemas of the chat and completions request bodies, as the server's checks see them.

The parser (requests, tool_requests, image_requests, lifetime) refuses a body with a 400 naming the
field; this module says the same rules as JSON schema for the OpenAPI description (engine.server.openapi),
so a client, a code generator or a fuzzer learns from the schema what the server takes: types, ranges,
enums, which fields go together (stream_options needs stream, tool_choice needs tools, ttl or keep_alive)
and, per role, what a message holds. The limits both sides use are constants of the parser, imported here.

What depends on the models (their ids, the vocabulary, the context length, whether one sees images) comes
from `ModelFacts`, read from what the server serves when /openapi.json is asked for: the `model` field is
an enum of the ids a request may name right now. A few checks compare values inside one request in ways
JSON schema cannot say (a named tool_choice must be one of the tools, min_tokens <= max_tokens, prompt plus
completion within the context); they answer a 400 with one of the codes in RUNTIME_CHECKS, which the
operations' descriptions list.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ..chat.harmony import REASONING_EFFORTS
from .image_requests import DETAILS
from .lifetime import DURATION_PATTERN
from .requests import (
    CHAT_FIELDS, COMPLETION_FIELDS, JSON_SCHEMA_FIELDS, MAX_N, MAX_TEMPERATURE, MAX_TOP_LOGPROBS,
    STREAM_OPTION_FIELDS, TEXT_PART_FIELDS,
)
from .tool_requests import RESERVED_KWARGS, TOOL_NAME_PATTERN

_INT = {"type": "integer"}
_NULL = {"type": "null"}
_STR = {"type": "string"}
_JSON_TYPES = {str: "string", dict: "object", bool: "boolean"}

# 400 codes of the checks no JSON schema can state: the only 400s a schema-valid body may get.
RUNTIME_CHECKS = {
    "context_length_exceeded": "the prompt plus max_tokens must fit the model's context",
    "empty_prompt": "a prompt must be at least one token (a tokenizer may drop characters such as controls)",
    "min_tokens_exceeds_max_tokens": "min_tokens must not exceed max_tokens",
    "tool_choice_not_in_tools": "a named tool_choice must name one of the tools",
    "duplicate_tool_name": "two tools may not share a function name",
    "chat_template_error": "the model's chat template may refuse a conversation (e.g. roles out of order)",
    "invalid_json_schema": "a response_format or tool parameters schema must compile to a grammar",
    "model_cannot_see_images": "only a model that sees images takes image parts",
    "invalid_image": "an image must decode within the server's limits",
    "invalid_text": "text must be valid Unicode (no lone surrogates)",
}


@dataclass(frozen=True)
class ModelFacts:
    """What the schema needs of one served model: the ids that reach it (its own, its adapters'), and,
    once loaded, its vocabulary size, context length and whether it sees images (None: not loaded)."""
    names: tuple[str, ...]
    vocab_size: int | None = None
    max_seq_len: int | None = None
    can_see_images: bool = False


def served_facts(source: Any) -> list[ModelFacts]:
    """ModelFacts of a ModelPool (every model it knows, the loaded ones with their adapters), of one
    ServedModel, or [] for None (nothing served yet)."""
    if source is None:
        return []
    if hasattr(source, "models"):  # engine.server.models_pool.ModelPool
        return [_facts(e.served) if e.served is not None else ModelFacts((e.name,)) for e in source.models.values()]
    return [_facts(source)]


def _facts(served: Any) -> ModelFacts:
    return ModelFacts((served.name, *served.adapters), served.tokenizer.vocab_size, served.max_seq_len,
                      bool(served.can_see_images))


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, _NULL]}


def _number(low: float | None = None, high: float | None = None, *, exclusive_low: bool = False) -> dict:
    out: dict[str, Any] = {"type": "number"}
    if low is not None:
        out["exclusiveMinimum" if exclusive_low else "minimum"] = low
    if high is not None:
        out["maximum"] = high
    return nullable(out)


def below_pattern(n: int) -> str:
    """A regex of the decimal integers 0 <= k < n (no sign, no leading zeros): token ids as object keys."""
    top = str(n - 1)
    alts = [f"[0-{top}]"] if len(top) == 1 else ["[0-9]"]
    alts += [f"[1-9][0-9]{{{length - 1}}}" for length in range(2, len(top))]
    if len(top) > 1:
        for i, digit in enumerate(top):
            low = 1 if i == 0 else 0
            if int(digit) > low:
                rest = len(top) - i - 1
                alts.append(f"{top[:i]}[{low}-{int(digit) - 1}]" + (f"[0-9]{{{rest}}}" if rest else ""))
        alts.append(top)
    return f"^(?:{'|'.join(alts)})$"


# ---- messages ---------------------------------------------------------------------------------------------
_TEXT_PART = {"type": "object", "required": sorted(TEXT_PART_FIELDS), "additionalProperties": False,
              "properties": {"type": {"const": "text"}, **{k: _STR for k in TEXT_PART_FIELDS - {"type"}}}}
_IMAGE_PART = {
    "type": "object", "required": ["type", "image_url"], "additionalProperties": False,
    "description": "an image, in user messages only, for a model that can see images (else a 400 with code "
                   "model_cannot_see_images): a data: URL (data:image/png;base64,...; PNG, JPEG, WEBP or GIF, "
                   "an animation's first frame), or an http(s) URL where the server runs with --allow-remote-images",
    "properties": {"type": {"const": "image_url"},
                   "image_url": {"type": "object", "required": ["url"], "additionalProperties": False,
                                 "properties": {"url": _STR, "detail": {"enum": list(DETAILS)}}}}}
TOOL_CALL = {"type": "object", "required": ["function"],
             "properties": {"id": _STR, "type": {"const": "function"},
                            "function": {"type": "object", "required": ["name"],
                                         "properties": {"name": _STR,
                                                        "arguments": {"anyOf": [_STR, {"type": "object"}]}}}}}
_TEXT = {"anyOf": [_STR, {"type": "array", "items": _TEXT_PART}]}


def _message(roles: list[str], required: list[str], **props: dict) -> dict:
    return {"type": "object", "required": ["role", *required], "additionalProperties": False,
            "properties": {"role": {"enum": roles}, "name": _STR, **props}}


def message_schema(images: bool) -> dict:
    """One chat message, by role: content is required except in an assistant message that calls tools; a
    tool message names the call it answers; tool calls and reasoning belong to assistant messages; image
    parts to user messages (when `images`: a served model may see them)."""
    user_content = ({"anyOf": [_STR, {"type": "array", "items": {"anyOf": [_TEXT_PART, _IMAGE_PART]}}]}
                    if images else _TEXT)
    assistant = {"tool_calls": nullable({"type": "array", "items": TOOL_CALL}),
                 "reasoning_content": nullable(_STR)}
    return {"anyOf": [
        _message(["system", "developer"], ["content"], content=_TEXT),
        _message(["user"], ["content"], content=user_content),
        _message(["assistant"], ["content"], content=_TEXT, **assistant),
        _message(["assistant"], ["tool_calls"], content=nullable(_TEXT),
                 **{**assistant, "tool_calls": {"type": "array", "items": TOOL_CALL}}),
        _message(["tool"], ["content", "tool_call_id"], content=_TEXT, tool_call_id=_STR),
    ]}


# ---- the other fields ---------------------------------------------------------------------------------------
_TOOL = {"type": "object", "required": ["type", "function"],
         "properties": {"type": {"const": "function"},
                        "function": {"type": "object", "required": ["name"],
                                     "properties": {"name": {"type": "string", "pattern": TOOL_NAME_PATTERN},
                                                    "description": _STR, "parameters": {"type": "object"},
                                                    "strict": nullable({"type": "boolean"})}}}}
_NAMED_CHOICE = {"type": "object", "required": ["type", "function"],
                 "properties": {"type": {"const": "function"},
                                "function": {"type": "object", "required": ["name"], "properties": {"name": _STR}}}}
_STOP = nullable({"anyOf": [{"type": "string", "minLength": 1},
                            {"type": "array", "items": {"type": "string", "minLength": 1}}]})
_RESPONSE_FORMAT = nullable({"oneOf": [
    {"type": "object", "required": ["type"], "additionalProperties": False,
     "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "required": ["type", "json_schema"], "additionalProperties": False,
     "properties": {"type": {"const": "json_schema"},
                    "json_schema": {"type": "object", "required": ["schema"], "additionalProperties": False,
                                    "properties": {k: {"type": "object"} if k == "schema" else
                                                   nullable({"type": _JSON_TYPES[t]})
                                                   for k, t in JSON_SCHEMA_FIELDS.items()}}}},
]})


def _token_ids(vocab: int | None) -> dict:
    return {"type": "array", "minItems": 1,
            "items": {"type": "integer", "minimum": 0, **({"maximum": vocab - 1} if vocab else {})}}


def field_schemas(facts: list[ModelFacts]) -> dict[str, dict]:
    """One schema per request field the parser knows (both endpoints), the model-dependent limits the
    widest any loaded model has (model_conditions narrows them per model)."""
    names = [n for f in facts for n in f.names]
    vocab = max((f.vocab_size for f in facts if f.vocab_size), default=None)
    context = max((f.max_seq_len for f in facts if f.max_seq_len), default=None)
    length = {"maximum": context - 1} if context else {}
    ids = _token_ids(vocab)
    model = {"enum": names} if names else _STR
    bias_key = {"propertyNames": {"pattern": below_pattern(vocab)}} if vocab else {}
    # image parts: when a served model sees images, or one not loaded yet (or none known) might
    images = not facts or any(f.can_see_images or not f.vocab_size for f in facts)
    return {
        "model": nullable({**model, "description": "a model's id or a loaded adapter's (GET /v1/models); "
                                                   "default: the --model one"}),
        "messages": {"type": "array", "minItems": 1, "items": message_schema(images)},
        "prompt": {"anyOf": [{"type": "string", "minLength": 1}, ids,
                             {"type": "array", "minItems": 1, "maxItems": 1,
                              "items": {"anyOf": [{"type": "string", "minLength": 1}, ids]}}],
                   "description": "one prompt: a string or a list of token ids (several prompts: several requests)"},
        "max_tokens": nullable({"type": "integer", "minimum": 1, **length}),
        "max_completion_tokens": nullable({"type": "integer", "minimum": 1, **length}),
        "min_tokens": nullable({"type": "integer", "minimum": 0, **length}),
        "temperature": _number(0, MAX_TEMPERATURE),
        "top_p": _number(0, 1, exclusive_low=True),
        "top_k": nullable({"type": "integer", "minimum": -1}),
        "min_p": _number(0, 1),
        "repetition_penalty": _number(0, None, exclusive_low=True),
        "presence_penalty": _number(-2, 2),
        "frequency_penalty": _number(-2, 2),
        "seed": nullable({"type": "integer", "minimum": 0, "maximum": 2**63 - 1}),
        "stop": _STOP,
        "n": nullable({"type": "integer", "minimum": 1, "maximum": MAX_N}),
        "priority": nullable({"type": "integer", "description": "rank when the KV cache runs short (vLLM's): "
                              "lower runs first; the worst-ranked running request gives its pages back and "
                              "resumes later"}),
        "truncate_prompt_tokens": nullable({"type": "integer", "minimum": 1, **({"maximum": context} if context else {}),
                                            "description": "keep only the prompt's last k tokens (vLLM's; after "
                                                           "the chat template); null: the whole prompt"}),
        "tools": nullable({"type": "array", "items": _TOOL}),
        "tool_choice": nullable({"anyOf": [{"enum": ["none", "auto", "required"]}, _NAMED_CHOICE]}),
        "parallel_tool_calls": nullable({"type": "boolean"}),
        "include_reasoning": nullable({"type": "boolean"}),
        "chat_template_kwargs": nullable({"type": "object", "propertyNames": {"not": {"enum": sorted(RESERVED_KWARGS)}},
                                          "description": "variables for the chat template (e.g. enable_thinking)"}),
        "reasoning_effort": nullable({"enum": list(REASONING_EFFORTS),
                                      "description": "how hard a harmony model (gpt-oss) thinks: its system "
                                                     "message's `Reasoning:` line; other templates get the variable"}),
        "best_of": nullable({"const": 1}),
        "suffix": _NULL,
        "stream": nullable({"type": "boolean"}),
        "stream_options": nullable({"type": "object", "additionalProperties": False,
                                    "properties": {k: nullable({"type": "boolean"}) for k in STREAM_OPTION_FIELDS}}),
        "logit_bias": nullable({"type": "object", "description": "token id (as a string) -> bias", **bias_key,
                                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}),
        "user": nullable(_STR),
        "response_format": _RESPONSE_FORMAT,
        "ignore_eos": nullable({"type": "boolean"}),
        "ttl": nullable({"type": "number", "minimum": 0,
                         "description": "seconds the model stays loaded once idle (LM Studio's ttl)"}),
        "keep_alive": {"anyOf": [{"type": "number"}, {"type": "string", "pattern": DURATION_PATTERN}, _NULL],
                       "description": "Ollama's keep_alive: seconds or a duration ('5m'); 0 unloads when idle, "
                                      "negative keeps the model loaded"},
        "echo": nullable({"type": "boolean"}),
        "top_logprobs": nullable({"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}),
        "logprobs": nullable({"type": "boolean"}),
    }


# Where the completions endpoint reads a name differently.
COMPLETION_OVERRIDES = {"logprobs": nullable({"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS})}


def _given(name: str, schema: dict | None = None) -> dict:
    """`name` is present and not null (and matches `schema`)."""
    return {"required": [name], "properties": {name: {"not": _NULL, **({"allOf": [schema]} if schema else {})}}}


def _needs(condition: dict, then: dict) -> dict:
    return {"if": condition, "then": then}


_FORCED_CHOICE = {"anyOf": [{"const": "required"}, {"type": "object"}]}
# Rules between fields of one body, as the parser applies them; each pair: (the fields it needs, the rule).
CROSS_FIELD_RULES = [
    ({"stream_options"}, _needs(_given("stream_options"), {"required": ["stream"],
                                                           "properties": {"stream": {"const": True}}})),
    ({"ttl", "keep_alive"}, {"not": {"allOf": [_given("ttl"), _given("keep_alive")]}}),
    ({"tool_choice", "tools"}, _needs(_given("tool_choice", {"enum": ["auto", "required"]}),
                                      {"required": ["tools"], "properties": {"tools": {"minItems": 1}}})),
    ({"tool_choice", "tools"}, _needs(_given("tool_choice", {"type": "object"}),
                                      {"required": ["tools"], "properties": {"tools": {"minItems": 1}}})),
    ({"tool_choice", "response_format"}, _needs(
        _given("tool_choice", _FORCED_CHOICE),
        {"properties": {"response_format": {"anyOf": [_NULL, {"properties": {"type": {"const": "text"}}}]}}})),
    ({"top_logprobs", "logprobs", "messages"}, _needs(_given("top_logprobs"), {
        "required": ["logprobs"], "properties": {"logprobs": {"const": True}}})),
    ({"echo", "logprobs", "prompt"}, _needs(_given("echo", {"const": True}), {"properties": {"logprobs": _NULL}})),
]


def model_conditions(facts: list[ModelFacts]) -> list[dict]:
    """Per-model limits where the loaded models differ: if `model` names one of them, its own context
    length and vocabulary bound max_tokens and token ids (the default model: also when `model` is absent)."""
    loaded = [f for f in facts if f.vocab_size]
    if len({(f.vocab_size, f.max_seq_len) for f in loaded}) < 2:
        return []
    out = []
    for i, f in enumerate(facts):
        if not f.vocab_size:
            continue
        named = {"required": ["model"], "properties": {"model": {"enum": list(f.names)}}}
        condition = {"anyOf": [named, {"not": _given("model")}]} if i == 0 else named
        ids = _token_ids(f.vocab_size)
        length = nullable({"type": "integer", "maximum": f.max_seq_len - 1})
        out.append(_needs(condition, {"properties": {
            "max_tokens": length, "max_completion_tokens": length, "min_tokens": length,
            "prompt": {"anyOf": [_STR, ids, {"type": "array", "items": {"anyOf": [_STR, ids]}}]},
            "logit_bias": nullable({"type": "object", "propertyNames": {"pattern": below_pattern(f.vocab_size)}})}}))
    return out


def request_schema(kind: str, facts: list[ModelFacts]) -> dict:
    """The body of a chat (kind "chat") or completions request: exactly the parser's fields (any other is
    refused), each as field_schemas says, and the rules between them; KeyError names a field with no schema."""
    fields, required = (CHAT_FIELDS, ["messages"]) if kind == "chat" else (COMPLETION_FIELDS, ["prompt"])
    schemas = field_schemas(facts) | (COMPLETION_OVERRIDES if kind == "completion" else {})
    props = {}
    for name in sorted(fields):
        if name not in schemas:
            raise KeyError(f"request field {name!r} has no schema in engine.server.request_schemas")
        props[name] = copy.deepcopy(schemas[name])
    rules = [rule for needs, rule in CROSS_FIELD_RULES if needs <= fields] + model_conditions(facts)
    out = {"type": "object", "required": required, "additionalProperties": False, "properties": props}
    if rules:
        out["allOf"] = copy.deepcopy(rules)
    return out

"""The server's OpenAPI 3.1 description, served at GET /openapi.json (as vLLM serves its own).

Clients, code generators and fuzzers (the tests run Schemathesis against it) read it, so it must say
what the server really does. The request bodies are built from the parser's own field sets
(requests.CHAT_FIELDS / COMPLETION_FIELDS): a field added there without a schema here makes
`openapi_spec()` raise, so the two cannot drift apart. A field's schema is at least as wide as what the
parser accepts (a value the parser takes must validate) and, where cheap to say, no wider: an
out-of-range temperature is invalid in both. What only the model decides (the context length, the
vocabulary) is a 400 at run time, documented on the operation rather than in the schema.
"""
from __future__ import annotations

import copy
from typing import Any

from .lifetime import DURATION_PATTERN
from .requests import CHAT_FIELDS, COMPLETION_FIELDS, MAX_N, MAX_TEMPERATURE, MAX_TOP_LOGPROBS, ROLES

OPENAPI_VERSION = "3.1.0"

_INT = {"type": "integer"}
_NULL = {"type": "null"}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, _NULL]}


def _number(low: float | None = None, high: float | None = None, *, exclusive_low: bool = False) -> dict:
    out: dict[str, Any] = {"type": "number"}
    if low is not None:
        out["exclusiveMinimum" if exclusive_low else "minimum"] = low
    if high is not None:
        out["maximum"] = high
    return _nullable(out)


_TEXT_PART = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_IMAGE_PART = {
    "type": "object", "required": ["type", "image_url"], "additionalProperties": False,
    "description": "an image, in user messages only, for a model that can see images (else a 400 with code "
                   "model_cannot_see_images): a data: URL (data:image/png;base64,...; PNG, JPEG, WEBP or GIF, "
                   "an animation's first frame), or an http(s) URL where the server runs with --allow-remote-images",
    "properties": {"type": {"const": "image_url"},
                   "image_url": {"type": "object", "required": ["url"], "additionalProperties": False,
                                 "properties": {"url": {"type": "string"},
                                                "detail": {"enum": ["auto", "low", "high"]}}}}}
_TOOL_CALL = {"type": "object", "required": ["id", "type", "function"],
              "properties": {"id": {"type": "string"}, "type": {"const": "function"},
                             "function": {"type": "object", "required": ["name", "arguments"],
                                          "properties": {"name": {"type": "string"},
                                                         "arguments": {"type": "string"}}}}}
_MESSAGE = {
    "type": "object", "required": ["role"], "additionalProperties": False,
    "description": "content may be null only in an assistant message that has tool_calls; a tool message "
                   "names the call it answers (tool_call_id)",
    "properties": {
        "role": {"enum": sorted(ROLES)},
        "content": _nullable({"anyOf": [{"type": "string"},
                                         {"type": "array", "items": {"anyOf": [_TEXT_PART, _IMAGE_PART]}}]}),
        "name": {"type": "string"},
        "tool_calls": _nullable({"type": "array", "items": _TOOL_CALL}),
        "tool_call_id": {"type": "string"},
        "reasoning_content": _nullable({"type": "string"}),
    },
}
_TOOL = {"type": "object", "required": ["type", "function"],
         "properties": {"type": {"const": "function"},
                        "function": {"type": "object", "required": ["name"],
                                     "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                                                    "parameters": {"type": "object"},
                                                    "strict": _nullable({"type": "boolean"})}}}}
_TOOL_CHOICE = _nullable({"anyOf": [
    {"enum": ["none", "auto", "required"]},
    {"type": "object", "required": ["type", "function"],
     "properties": {"type": {"const": "function"},
                    "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}},
]})
_STOP = _nullable({"anyOf": [{"type": "string", "minLength": 1},
                             {"type": "array", "items": {"type": "string", "minLength": 1}}]})
_RESPONSE_FORMAT = _nullable({"oneOf": [
    {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "required": ["type", "json_schema"],
     "properties": {"type": {"const": "json_schema"},
                    "json_schema": {"type": "object", "required": ["schema"],
                                    "properties": {"name": {"type": "string"}, "schema": {"type": "object"}}}}},
]})

# One schema per request field the parser knows (both endpoints); the parser's checks, said as JSON schema.
FIELD_SCHEMAS: dict[str, dict] = {
    "model": _nullable({"type": "string", "description": "the served model's id or a loaded adapter's name "
                                                         "(GET /v1/models); default: the base model"}),
    "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
    "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": _INT},
                         {"type": "array", "minItems": 1, "maxItems": 1,
                          "items": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": _INT}]}}],
               "description": "one prompt: a string or a list of token ids (several prompts: several requests)"},
    "max_tokens": _nullable({"type": "integer", "minimum": 1}),
    "max_completion_tokens": _nullable({"type": "integer", "minimum": 1}),
    "min_tokens": _nullable({"type": "integer", "minimum": 0}),
    "temperature": _number(0, MAX_TEMPERATURE),
    "top_p": _number(0, 1, exclusive_low=True),
    "top_k": _nullable({"type": "integer", "minimum": -1}),
    "min_p": _number(0, 1),
    "repetition_penalty": _number(0, None, exclusive_low=True),
    "presence_penalty": _number(-2, 2),
    "frequency_penalty": _number(-2, 2),
    "seed": _nullable({"type": "integer", "minimum": 0, "maximum": 2**63 - 1}),
    "stop": _STOP,
    "n": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_N}),
    "priority": _nullable({"type": "integer", "description": "rank when the KV cache runs short (vLLM's): lower "
                           "runs first; the worst-ranked running request gives its pages back and resumes later"}),
    "truncate_prompt_tokens": _nullable({"type": "integer", "minimum": 1, "description": "keep only the prompt's "
                                         "last k tokens (vLLM's; after the chat template); null: the whole prompt"}),
    "tools": _nullable({"type": "array", "items": _TOOL}),
    "tool_choice": _TOOL_CHOICE,
    "parallel_tool_calls": _nullable({"type": "boolean"}),
    "include_reasoning": _nullable({"type": "boolean"}),
    "chat_template_kwargs": _nullable({"type": "object", "description": "variables for the chat template "
                                                                       "(e.g. enable_thinking)"}),
    "best_of": _nullable({"const": 1}),
    "suffix": _NULL,
    "stream": _nullable({"type": "boolean"}),
    "stream_options": _nullable({"type": "object", "additionalProperties": False,
                                 "properties": {"include_usage": _nullable({"type": "boolean"}),
                                                "continuous_usage_stats": _nullable({"type": "boolean"})}}),
    "logit_bias": _nullable({"type": "object", "description": "token id (as a string) -> bias",
                             "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}),
    "user": _nullable({"type": "string"}),
    "response_format": _RESPONSE_FORMAT,
    "ignore_eos": _nullable({"type": "boolean"}),
    "ttl": _nullable({"type": "number", "minimum": 0,
                      "description": "seconds the model stays loaded once idle (LM Studio's ttl)"}),
    "keep_alive": {"anyOf": [{"type": "number"}, {"type": "string", "pattern": DURATION_PATTERN}, _NULL],
                   "description": "Ollama's keep_alive: seconds or a duration ('5m'); 0 unloads when idle, "
                                  "negative keeps the model loaded"},
    "echo": _nullable({"type": "boolean"}),
    "top_logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}),
}
# Where the two endpoints read one name differently.
CHAT_OVERRIDES = {"logprobs": _nullable({"type": "boolean"})}
COMPLETION_OVERRIDES = {"logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS})}


def request_schema(fields: set[str], overrides: dict[str, dict], required: list[str]) -> dict:
    """An object schema with exactly `fields` (the parser refuses any other); KeyError names a field with
    no schema."""
    props = {}
    for name in sorted(fields):
        schema = overrides.get(name) or FIELD_SCHEMAS.get(name)
        if schema is None:
            raise KeyError(f"request field {name!r} has no schema in engine.server.openapi.FIELD_SCHEMAS")
        props[name] = copy.deepcopy(schema)
    return {"type": "object", "required": required, "additionalProperties": False, "properties": props}


# ---- responses ------------------------------------------------------------------------------------------
_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
          "properties": {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT,
                         "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": _INT}}}}
_FINISH = {"enum": ["stop", "length", "tool_calls", None]}
_CHAT_RESPONSE = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "chat.completion"}, "created": _INT, "model": {"type": "string"},
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["index", "message", "finish_reason"],
            "properties": {"index": _INT, "finish_reason": _FINISH, "logprobs": _nullable({"type": "object"}),
                           "message": {"type": "object", "required": ["role"],
                                       "properties": {"role": {"const": "assistant"},
                                                      "content": _nullable({"type": "string"}),
                                                      "tool_calls": {"type": "array", "items": _TOOL_CALL},
                                                      "reasoning_content": _nullable({"type": "string"})}}}}},
        "usage": _USAGE,
    },
}
_COMPLETION_RESPONSE = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "text_completion"}, "created": _INT, "model": {"type": "string"},
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["index", "text", "finish_reason"],
            "properties": {"index": _INT, "text": {"type": "string"}, "finish_reason": _FINISH,
                           "logprobs": _nullable({"type": "object"})}}},
        "usage": _USAGE,
    },
}
_MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by"],
          "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": _INT,
                         "owned_by": {"type": "string"}, "root": {"type": "string"},
                         "parent": _nullable({"type": "string"}), "max_model_len": _INT,
                         "loaded": {"type": "boolean"}, "status": {"enum": ["loaded", "loading", "unloaded"]},
                         "memory_bytes": _INT, "pinned": {"type": "boolean"}}}
ERROR_SCHEMA = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"], "additionalProperties": False,
        "properties": {"message": {"type": "string", "minLength": 1}, "type": {"type": "string"},
                       "param": _nullable({"type": "string"}), "code": _nullable({"type": "string"})}}},
}
_REF_ERROR = {"$ref": "#/components/schemas/Error"}
# OpenAPI before 3.2 describes a server-sent-event stream by one event: `data` is a chunk's JSON, an error's
# JSON (the status is already sent), or [DONE].
_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": {"type": "string", "minLength": 1}, "event": {"type": "string"}}}
_ERROR_TEXT = {400: "the request is invalid (the message names the field)", 401: "missing or wrong API key",
               404: "unknown model, adapter or route", 413: "the body is larger than 64 MiB",
               503: "no model is loaded, or it is being replaced"}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _errors(*codes: int) -> dict:
    return {str(c): {"description": _ERROR_TEXT[c], "content": _json(_REF_ERROR)} for c in codes}


def _op(summary: str, ok: dict, errors: tuple[int, ...], body: dict | None = None, op_id: str = "") -> dict:
    out: dict[str, Any] = {"summary": summary, "operationId": op_id, "responses": {"200": ok, **_errors(*errors)}}
    if body is not None:
        out["requestBody"] = {"required": True, "content": _json(body)}
    return out


def _generation(summary: str, response_ref: str, op_id: str) -> dict:
    ok = {"description": "the completion; with stream: true, server-sent events (`data: {chunk}` ... "
                         "`data: [DONE]`)",
          "content": {**_json({"$ref": response_ref}), "text/event-stream": {"schema": _SSE_EVENT}}}
    return _op(summary, ok, (400, 401, 404, 413, 503),
               {"$ref": response_ref.replace("Response", "Request")}, op_id)


def openapi_spec(server_url: str | None = None) -> dict:
    """The whole description; `server_url` (e.g. http://127.0.0.1:8399) fills `servers`."""
    text_ok = {"description": "done", "content": {"text/plain": {"schema": {"type": "string"}}}}
    lora_name = {"type": "string", "minLength": 1}
    paths = {
        "/health": {"get": _op("200 once a model is served", text_ok, (503,), op_id="health")},
        "/v1/models": {"get": _op("the base model and each loaded LoRA adapter", {
            "description": "model list", "content": _json({
                "type": "object", "required": ["object", "data"],
                "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL}}})},
            (401, 503), op_id="listModels")},
        "/v1/chat/completions": {"post": _generation("a chat reply", "#/components/schemas/ChatCompletionResponse",
                                                     "createChatCompletion")},
        "/v1/completions": {"post": _generation("a raw-text completion", "#/components/schemas/CompletionResponse",
                                                "createCompletion")},
        "/v1/load_lora_adapter": {"post": _op("load a PEFT adapter folder, served as model `lora_name`", text_ok,
                                              (400, 401, 404, 503), {
            "type": "object", "required": ["lora_name", "lora_path"],
            "properties": {"lora_name": lora_name, "lora_path": {"type": "string", "minLength": 1}}},
            op_id="loadLoraAdapter")},
        "/v1/unload_lora_adapter": {"post": _op("unload an adapter (requests running with it finish)", text_ok,
                                                (400, 401, 404, 503), {
            "type": "object", "required": ["lora_name"], "properties": {"lora_name": lora_name}},
            op_id="unloadLoraAdapter")},
        "/metrics": {"get": _op("Prometheus metrics (vLLM's names)", {
            "description": "text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}},
            (), op_id="metrics")},
        "/pagedeck/pages": {"get": _op("the K/V cache's page map", {
            "description": "pages by state and owner", "content": _json({
                "type": "object", "required": ["page_size", "pages_total", "page_states"],
                "properties": {"page_size": _INT, "pages_total": _INT, "page_states": {"type": "array"}}})},
            (401, 503), op_id="pages")},
        "/openapi.json": {"get": _op("this description", {
            "description": "OpenAPI 3.1", "content": _json({"type": "object"})}, (), op_id="openapi")},
    }
    spec = {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "pagedeck OpenAI-compatible server", "version": "1",
                 "description": "OpenAI's chat and completions API over pagedeck's paged batched generator; "
                                "errors in OpenAI's shape ({\"error\": {message, type, param, code}})."},
        "paths": paths,
        "components": {
            "schemas": {
                "ChatCompletionRequest": request_schema(CHAT_FIELDS, CHAT_OVERRIDES, ["messages"]),
                "CompletionRequest": request_schema(COMPLETION_FIELDS, COMPLETION_OVERRIDES, ["prompt"]),
                "ChatCompletionResponse": _CHAT_RESPONSE,
                "CompletionResponse": _COMPLETION_RESPONSE,
                "Error": ERROR_SCHEMA,
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    if server_url:
        spec["servers"] = [{"url": server_url}]
    return spec

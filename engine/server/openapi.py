"""The server's OpenAPI 3.1 description, served at GET /openapi.json (as vLLM serves its own).

Clients, code generators and fuzzers (the tests run Schemathesis against it) read it, so it must say
what the server really does. The request bodies come from engine.server.request_schemas, built from the
parser's own field sets and limits: a body the schema takes gets past every check but the few listed
under RUNTIME_CHECKS (each a 400 with its code), and a body it refuses is a 400. It is built per request
of /openapi.json from what is served then (`served_facts`): the model ids, adapters, vocabulary and
context length are today's, so `model` and `lora_name` are enums of names that exist.
"""
from __future__ import annotations

from typing import Any

from .request_schemas import RUNTIME_CHECKS, TOOL_CALL, ModelFacts, nullable, request_schema

OPENAPI_VERSION = "3.1.0"

_INT = {"type": "integer"}
_NULL = {"type": "null"}
_nullable = nullable
_TOOL_CALL = {**TOOL_CALL, "required": ["id", "type", "function"]}  # a reply's calls carry all three


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


_RUNTIME_TEXT = "; ".join(f"{code}: {text}" for code, text in RUNTIME_CHECKS.items())


def _generation(summary: str, response_ref: str, op_id: str) -> dict:
    ok = {"description": "the completion; with stream: true, server-sent events (`data: {chunk}` ... "
                         "`data: [DONE]`)",
          "content": {**_json({"$ref": response_ref}), "text/event-stream": {"schema": _SSE_EVENT}}}
    op = _op(summary, ok, (400, 401, 404, 413, 503), {"$ref": response_ref.replace("Response", "Request")}, op_id)
    op["description"] = ("A body that the schema takes is refused only by checks that depend on more than one "
                         "value, each a 400 with its `code`: " + _RUNTIME_TEXT + ".")
    return op


def _lora_ops() -> dict:
    """vLLM's runtime adapter API. Which adapters exist is state, not a rule of the body: an unknown name or
    folder is a 404, a name already loaded a 400."""
    text_ok = {"description": "done", "content": {"text/plain": {"schema": {"type": "string"}}}}
    name = {"type": "string", "minLength": 1}
    path = {"type": "string", "minLength": 1, "description": "a PEFT adapter folder on the server's machine"}
    return {
        "/v1/load_lora_adapter": {"post": _op(
            "load a PEFT adapter folder into the --model one, served as model `lora_name`", text_ok,
            (400, 401, 404, 503), {"type": "object", "required": ["lora_name", "lora_path"],
                                   "properties": {"lora_name": name, "lora_path": path}}, op_id="loadLoraAdapter")},
        "/v1/unload_lora_adapter": {"post": _op(
            "unload an adapter (requests running with it finish)", text_ok, (400, 401, 404, 503),
            {"type": "object", "required": ["lora_name"],
             "properties": {"lora_name": {**name, "description": "a loaded adapter (GET /v1/models)"}}},
            op_id="unloadLoraAdapter")},
    }


def openapi_spec(server_url: str | None = None, facts: list[ModelFacts] | None = None) -> dict:
    """The whole description; `server_url` (e.g. http://127.0.0.1:8399) fills `servers`, `facts` (the
    served models, request_schemas.served_facts) the model ids and limits (none: any id, no model limits)."""
    facts = facts or []
    text_ok = {"description": "done", "content": {"text/plain": {"schema": {"type": "string"}}}}
    names = [n for f in facts for n in f.names]
    model_id = {"name": "model", "in": "path", "required": True,
                "schema": {"enum": names} if names else {"type": "string"}}
    paths = {
        "/health": {"get": _op("200 once a model is served", text_ok, (503,), op_id="health")},
        "/v1/models": {"get": _op("every model the server can serve, and each loaded LoRA adapter", {
            "description": "model list", "content": _json({
                "type": "object", "required": ["object", "data"],
                "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL}}})},
            (401, 503), op_id="listModels")},
        "/v1/models/{model}": {"get": {**_op("one model or adapter, as /v1/models lists it", {
            "description": "the model", "content": _json(_MODEL)}, (401, 404, 503), op_id="retrieveModel"),
            "parameters": [model_id]}},
        "/v1/chat/completions": {"post": _generation("a chat reply", "#/components/schemas/ChatCompletionResponse",
                                                     "createChatCompletion")},
        "/v1/completions": {"post": _generation("a raw-text completion", "#/components/schemas/CompletionResponse",
                                                "createCompletion")},
        **_lora_ops(),
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
                "ChatCompletionRequest": request_schema("chat", facts),
                "CompletionRequest": request_schema("completion", facts),
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

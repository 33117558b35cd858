"""OpenAI request bodies -> GenerationRequest: the job's prompt ids, sampler, stops, filters and options.

Every field is checked before anything reaches the engine, and a bad one is a 400 naming it. Unknown
fields are refused too (a silently ignored field would answer a different question than the one
asked); tools, tool choice and reasoning are checked by tool_requests, image parts by image_requests; the accepted extras are the ones vLLM, SGLang and llama-server also take (top_k, min_p,
repetition_penalty, min_tokens, ignore_eos, priority), so a client written for them works here unchanged.
Sampling defaults are OpenAI's (temperature 1, top_p 1, no penalties), not ExLlamaV2's chat defaults.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..contract import InvalidSetting, SamplerSettings
from ..generator.filters import JSONSchemaFilter
from .errors import ApiError, bad_request
from .image_requests import Images, cannot_see_images
from .prompt_truncation import truncate_prompt
from .served import ServedModel
from .tool_requests import TOOL_FIELDS, ToolPlan, check_tool_message, parse_tool_plan, render_prompt, tool_filters

MAX_TOP_LOGPROBS = 20
MAX_N = 32  # choices per request: each is a job of its own, all sharing the prompt's pages
MAX_TEMPERATURE = 2.0  # OpenAI's cap; the sampler itself takes any finite temperature
# OpenAI's names for the sampler fields a request sets (the others share SamplerSettings' names)
OPENAI_NAMES = {"token_repetition_penalty": "repetition_penalty", "token_presence_penalty": "presence_penalty",
                "token_frequency_penalty": "frequency_penalty", "token_bias": "logit_bias"}
COMMON_FIELDS = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "seed", "stop", "n", "stream", "stream_options", "logit_bias", "user",
    "response_format", "min_tokens", "ignore_eos",
    "priority",  # vLLM's: lower is more urgent; when the cache runs dry the worst-ranked job gives its pages back
    "truncate_prompt_tokens",  # vLLM's: keep only the prompt's last k tokens (prompt_truncation)
    "ttl", "keep_alive",  # how long the model stays loaded once idle (engine.server.lifetime, the model pool)
}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"} | TOOL_FIELDS
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "logprobs", "echo", "best_of", "suffix"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}
TEXT_PART_FIELDS = {"type", "text"}
STREAM_OPTION_FIELDS = ("include_usage", "continuous_usage_stats")
RESPONSE_FORMAT_FIELDS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
JSON_SCHEMA_FIELDS = {"name": str, "description": str, "schema": dict, "strict": bool}  # OpenAI's; name optional


@dataclass
class GenerationRequest:
    kind: str  # "chat" | "completion"
    model: str  # the id the client named (echoed in the response)
    adapter: str | None
    input_ids: torch.Tensor
    prompt: str  # the prompt text (completions' echo)
    max_tokens: int
    min_tokens: int
    sampler: SamplerSettings
    seed: int | None
    stops: list = field(default_factory=list)  # token ids and strings, as DynamicJob's stop_conditions
    filters: list = field(default_factory=list)
    logprobs: int | None = None  # None: off; else how many alternatives per token (0..20)
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    plan: ToolPlan | None = None  # chat: tools, tool choice and how to read the reply (reasoning, calls)
    new_filters: Callable[[], list] | None = None  # a fresh set of the filters (another choice's)
    n: int = 1  # choices: n jobs on the same prompt (prefilled once), choice i seeded seed + i
    embeddings: Any = None  # a chat with images: what ServedModel.encode_chat made of them, for the job
    priority: int = 0  # the job's rank when pages run short: lower runs first and is preempted last (vLLM's)

    def choice_seed(self, index: int) -> int | None:
        """Choice i's seed: seed + i, so seeded choices differ from each other and reproduce; None: random."""
        return None if self.seed is None else (self.seed + index) % 2**63

    def choice_filters(self, index: int) -> list:
        """Choice i's filters: a grammar filter follows one reply, so every choice but the first gets new ones."""
        return self.filters if index == 0 or self.new_filters is None else self.new_filters()


def parse_request(kind: str, body: Any, served: ServedModel, default_max_tokens: int | None,
                  images: Images | None = None) -> GenerationRequest:
    """Check an OpenAI chat (kind "chat") or completions ("completion") body; ApiError(400/404) if bad.
    `images`: the body's image parts decoded (image_requests.load_request_images); a chat with images is
    encoded by the served model's encode_chat (prompt ids + image embeddings)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    allowed = CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"unsupported parameter(s): {', '.join(unknown)}", unknown[0], "unsupported_parameter")
    adapter = served.resolve(body.get("model"))
    model = body.get("model") or served.name
    tok = served.tokenizer
    plan = None
    if kind == "chat":
        plan = parse_tool_plan(body, tok)
        messages = _messages(body.get("messages"), images or {}, served.name)
        if any(isinstance(m["content"], list) for m in messages):  # image parts: the vision model encodes them
            prompt, (ids, embeddings) = "", served.encode_chat(messages, plan)
        else:
            prompt = _unicode(render_prompt(plan, messages, tok), "messages")
            ids, embeddings = tok.encode(prompt, encode_special_tokens=True), None
        stop_tokens = sorted(tok.stop_token_ids)
    else:
        prompt, ids = _prompt(body.get("prompt"), tok)
        stop_tokens = [tok.eos_token_id] if tok.eos_token_id is not None else []
        _optional_is(body, "suffix", None, "suffix is not supported (no fill-in-the-middle)")
        best_of = body.get("best_of")
        if best_of is not None and _integer(best_of) != 1:
            raise bad_request("best_of must be 1: this server returns one completion per request", "best_of")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad_request("user must be a string (an end-user id)", "user")
    n = _integer(body.get("n", 1) if body.get("n") is not None else 1)
    if n is None or not 1 <= n <= MAX_N:
        raise bad_request(f"n must be an integer from 1 to {MAX_N}, got {body['n']!r}", "n")
    if ids.shape[1] == 0:
        raise bad_request("the prompt is empty (no tokens)", "messages" if kind == "chat" else "prompt", "empty_prompt")
    ids, prompt = truncate_prompt(body, ids, prompt, served.max_seq_len,
                                  lambda kept: tok.decode(kept, decode_special_tokens=True),
                                  kind == "chat" and embeddings is not None)
    max_tokens = _max_tokens(body, kind, ids.shape[1], served.max_seq_len, default_max_tokens)
    min_tokens = _int_field(body, "min_tokens", 0, low=0)
    if min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})", "min_tokens",
                          "min_tokens_exceeds_max_tokens")
    if _bool_field(body, "ignore_eos", False):
        stop_tokens = []
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise bad_request("stop must be a non-empty string or a list of non-empty strings", "stop")
    for s in stop or []:
        _unicode(s, "stop")
    stream = _bool_field(body, "stream", False)
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")
        if not isinstance(options, dict) or set(options) - set(STREAM_OPTION_FIELDS):
            raise bad_request("stream_options takes include_usage and continuous_usage_stats (booleans)",
                              "stream_options")
    options = options or {}
    filters = _response_format(body.get("response_format"))
    new_filters = lambda: _response_format(body.get("response_format"))  # noqa: E731
    if plan is not None and plan.forced:
        if filters:
            raise bad_request("response_format can't be combined with a required or named tool_choice (the reply "
                              "is then a tool call)", "response_format")
        filters = tool_filters(plan, tok)
        new_filters = lambda: tool_filters(plan, tok)  # noqa: E731
    return GenerationRequest(
        kind=kind, model=model, adapter=adapter, input_ids=ids, prompt=prompt, max_tokens=max_tokens,
        min_tokens=min_tokens, sampler=_sampler(body, tok.vocab_size), seed=_seed(body.get("seed")),
        stops=stop_tokens + list(stop or []), filters=filters,
        logprobs=_logprobs(body, kind), echo=_bool_field(body, "echo", False), stream=stream,
        include_usage=_bool_field(options, "include_usage", False, "stream_options.include_usage"),
        continuous_usage=_bool_field(options, "continuous_usage_stats", False, "stream_options.continuous_usage_stats"),
        plan=plan, new_filters=new_filters, n=n, embeddings=embeddings if kind == "chat" else None,
        priority=_priority(body.get("priority")),
    )


# ---- prompt ------------------------------------------------------------------------------------------
def _messages(messages: Any, images: Images, model_name: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object with role and content", where)
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_request(f"{where}.role {role!r} is not supported (use system, developer, user, assistant or "
                              "tool)", f"{where}.role")
        extra = set(m) - MESSAGE_FIELDS
        if extra:
            raise bad_request(f"{where} has unsupported fields: {', '.join(sorted(extra))}", where)
        if "name" in m and not isinstance(m["name"], str):
            raise bad_request(f"{where}.name must be a string", f"{where}.name")
        if "tool_call_id" in m and role != "tool":
            raise bad_request(f"{where}.tool_call_id belongs to tool messages only", f"{where}.tool_call_id")
        tool_fields = check_tool_message(m, where)
        content = m.get("content")
        if content is None and "tool_calls" in tool_fields:  # a reply that only called tools
            content = ""
        out.append({"role": ROLES[role], "content": _content(content, where, images, i, model_name),
                    **tool_fields})
    return out


def _content(content: Any, where: str, images: Images, index: int, model_name: str) -> str | list[dict]:
    """A message's text: a string, or a list of {"type": "text", "text": ...} parts joined; with image parts
    (decoded in `images`), the parts as a list: text parts and {"type": "image", "image": PIL image}."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts, parts = [], []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image_url":
                if (index, j) not in images:
                    raise cannot_see_images(model_name, f"{where}.content[{j}]")
                parts.append({"type": "image", "image": images[(index, j)]})
                continue
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str) \
                    or set(part) - TEXT_PART_FIELDS:
                raise bad_request(f"{where}.content[{j}] must be a text part ({{\"type\": \"text\", \"text\": ...}}) "
                                  "or an image_url part", f"{where}.content")
            texts.append(part["text"])
            parts.append({"type": "text", "text": part["text"]})
        return parts if len(parts) > len(texts) else "".join(texts)
    raise bad_request(f"{where}.content must be a string or a list of text parts", f"{where}.content")


def _prompt(prompt: Any, tok: Any, nested: bool = False) -> tuple[str, torch.Tensor]:
    """A completions prompt: a string, a token-id list, or one string / one token-id list in a list (n
    prompts: 400; a list inside that one is ids only, as the schema says)."""
    ids = [_integer(t) for t in prompt] if isinstance(prompt, list) else []
    if ids and None not in ids:
        prompt = ids
        if min(prompt) < 0 or max(prompt) >= tok.vocab_size:
            raise bad_request(f"prompt token ids must be in [0, {tok.vocab_size})", "prompt")
        return tok.decode(prompt, decode_special_tokens=True), torch.tensor([prompt], dtype=torch.long)
    if nested and isinstance(prompt, list):
        raise bad_request("a list inside prompt must hold token ids (integers)", "prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        return _prompt(prompt[0], tok, nested=True)
    if isinstance(prompt, list):
        raise bad_request("prompt must be one string or one list of token ids (several prompts: send several "
                          "requests)", "prompt")
    if not isinstance(prompt, str):
        raise bad_request("prompt must be a string", "prompt")
    return prompt, tok.encode(_unicode(prompt, "prompt"), add_bos=tok.add_bos)


def _unicode(text: str, param: str) -> str:
    """JSON's \\ud800-style escapes decode to lone surrogates, which no tokenizer (nor UTF-8) can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(f"{param} contains a lone surrogate ({text[exc.start]!r} at {exc.start}): not valid "
                          f"Unicode text", param, "invalid_text") from None
    return text


def _max_tokens(body: dict, kind: str, prompt_len: int, max_seq_len: int, default: int | None) -> int:
    """The request's completion limit; without one, `default` capped by the context (None: the context's room)."""
    room = max_seq_len - prompt_len
    if room < 1:
        raise bad_request(f"This model's maximum context length is {max_seq_len} tokens. However, your prompt has "
                          f"{prompt_len} tokens, leaving no room for a completion.",
                          "messages" if kind == "chat" else "prompt", "context_length_exceeded")
    given = [name for name in ("max_tokens", "max_completion_tokens") if body.get(name) is not None]
    if not given:
        return room if default is None else min(room, default)
    limits = [_completion_limit(body[name], name, prompt_len, max_seq_len) for name in given]
    return limits[-1]  # both given: max_completion_tokens, OpenAI's newer name, is the limit


def _completion_limit(value: Any, field_name: str, prompt_len: int, max_seq_len: int) -> int:
    """One limit field, checked whether or not it is the one that counts: an integer >= 1 that fits the
    context with the prompt (a field the server would not check is a field it silently ignores)."""
    room = max_seq_len - prompt_len
    if _integer(value) is None or value < 1:
        raise bad_request(f"{field_name} must be an integer >= 1, got {value!r}", field_name)
    value = _integer(value)
    if value > room:
        raise bad_request(f"This model's maximum context length is {max_seq_len} tokens. However, you requested "
                          f"{prompt_len + value} tokens ({prompt_len} in the prompt, {value} in the completion). "
                          f"Please reduce the length of the prompt or the completion.", field_name,
                          "context_length_exceeded")
    return value


# ---- sampling ----------------------------------------------------------------------------------------
def _sampler(body: dict, vocab_size: int) -> SamplerSettings:
    """The request's sampler, checked by SamplerSettings.validate (its error names the OpenAI parameter);
    on top of it only what this API adds: top_k -1 means off, temperature is capped at OpenAI's 2, and
    logit_bias keys are vocabulary ids with biases in [-100, 100]."""
    top_k = _integer(body.get("top_k"))
    if body.get("top_k") is not None and (top_k is None or top_k < -1):
        raise bad_request(f"top_k must be an integer >= 1, or 0 / -1 for off, got {body['top_k']!r}", "top_k")
    settings = SamplerSettings(
        temperature=_number(body, "temperature", 1.0), top_k=max(0, top_k or 0), top_p=_number(body, "top_p", 1.0),
        min_p=_number(body, "min_p", 0.0), token_repetition_penalty=_number(body, "repetition_penalty", 1.0),
        token_presence_penalty=_number(body, "presence_penalty", 0.0),
        token_frequency_penalty=_number(body, "frequency_penalty", 0.0),
        token_bias=_logit_bias(body.get("logit_bias"), vocab_size),
    )
    try:
        settings.validate()
    except InvalidSetting as exc:
        param = OPENAI_NAMES.get(exc.field, exc.field)
        raise bad_request(param + str(exc)[len(exc.field):], param) from None
    if settings.temperature > MAX_TEMPERATURE:
        raise bad_request(f"temperature={settings.temperature!r} is out of range: must be in [0, {MAX_TEMPERATURE:g}]",
                          "temperature")
    return settings


def _logit_bias(bias: Any, vocab_size: int) -> dict[int, float] | None:
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise bad_request("logit_bias must be an object mapping token ids to a bias in [-100, 100]", "logit_bias")
    out = {}
    for key, value in bias.items():
        if not key.isascii() or not key.isdigit() or (key.startswith("0") and key != "0"):
            raise bad_request(f"logit_bias key {key!r} is not a token id (a decimal integer)", "logit_bias")
        tok = int(key)
        if not 0 <= tok < vocab_size:
            raise bad_request(f"logit_bias token id {tok} is outside the vocabulary [0, {vocab_size})", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise bad_request(f"logit_bias[{key}] must be a number in [-100, 100], got {value!r}", "logit_bias")
        out[tok] = float(value)
    return out


def _seed(seed: Any) -> int | None:
    if seed is None:
        return None
    value = _integer(seed)
    if value is None or not 0 <= value < 2**63:
        raise bad_request(f"seed must be an integer in [0, 2^63), got {seed!r}", "seed")
    return value


def _priority(priority: Any) -> int:
    """vLLM's priority: any integer, lower more urgent; absent or null is 0."""
    if priority is None:
        return 0
    if _integer(priority) is None:
        raise bad_request(f"priority must be an integer (lower is more urgent), got {priority!r}", "priority")
    return _integer(priority)


def _response_format(fmt: Any) -> list:
    if fmt is None:
        return []
    kind = fmt.get("type") if isinstance(fmt, dict) and isinstance(fmt.get("type"), str) else None
    extra = sorted(set(fmt) - RESPONSE_FORMAT_FIELDS[kind]) if kind in RESPONSE_FORMAT_FIELDS else []
    if extra:
        raise bad_request(f"response_format of type {kind} takes no {', '.join(extra)}", "response_format")
    if kind == "text":
        return []
    if kind == "json_object":
        return [JSONSchemaFilter({"type": "object"})]
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad_request("response_format json_schema needs json_schema.schema (a JSON schema object)",
                              "response_format")
        bad = sorted(k for k, v in spec.items() if k not in JSON_SCHEMA_FIELDS or not
                     (v is None or isinstance(v, JSON_SCHEMA_FIELDS[k])))
        if bad:
            raise bad_request(f"response_format.json_schema takes name and description (strings), schema (an "
                              f"object) and strict (true or false); not {', '.join(map(repr, bad))} as sent",
                              "response_format.json_schema")
        try:
            return [JSONSchemaFilter(schema)]
        except ValueError as exc:
            raise bad_request(str(exc), "response_format", "invalid_json_schema") from None
    raise bad_request(f"response_format type must be text, json_object or json_schema, got {kind!r}",
                      "response_format")


def _logprobs(body: dict, kind: str) -> int | None:
    if kind == "completion":
        value = _integer(body.get("logprobs"))
        if body.get("logprobs") is None:
            return None
        if value is None or not 0 <= value <= MAX_TOP_LOGPROBS:
            raise bad_request(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {body['logprobs']!r}",
                              "logprobs")
        if body.get("echo"):
            raise bad_request("echo with logprobs is not supported (no prompt logprobs)", "echo")
        return value
    on = _bool_field(body, "logprobs", False)
    if body.get("top_logprobs") is None:
        return 0 if on else None
    top = _integer(body["top_logprobs"])
    if top is None or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise bad_request(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {body['top_logprobs']!r}",
                          "top_logprobs")
    if not on:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    return top


# ---- field helpers -----------------------------------------------------------------------------------
def _integer(value: Any) -> int | None:
    """A JSON integer as an int, else None. 3.0 is one (JSON schema's integer, and vLLM's pydantic, take it)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else None


def _int_field(body: dict, name: str, default: int, low: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if _integer(value) is None or value < low:
        raise bad_request(f"{name} must be an integer >= {low}, got {value!r}", name)
    return _integer(value)


def _number(body: dict, name: str, default: float) -> Any:
    """A numeric field as a float (the sampler's own type), anything else as sent, for validate() to refuse."""
    value = body.get(name)
    if value is None:
        return default
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _bool_field(body: dict, name: str, default: bool, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{param or name} must be true or false, got {value!r}", param or name)
    return value


def _optional_is(body: dict, name: str, allowed: Any, message: str) -> None:
    if body.get(name, allowed) != allowed:
        raise ApiError(400, message, name)

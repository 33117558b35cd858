"""RemoteBackend: chats that stream from an OpenAI-compatible server instead of the in-process generator.

It speaks the same Backend protocol as EngineService (app.core.backend), and a RemoteJob yields the same
result dicts a DynamicJobAsync does ("started", then "streaming" with text, the last one with eos and
token counts), so ChatSession's stop, regenerate, edit and per-reply TTFT/tok/s work unchanged. Token
counts come from the stream: one content event is one token on vLLM, SGLang, llama-server and pagedeck
(vLLM's continuous usage stats are used where the server sends them), and the final usage event gives
the exact prompt/completion/cached counts.

A thinking model's reasoning (vLLM's `reasoning_content` deltas, or `reasoning` in newer vLLM) is kept
in the reply's text between <think> markers, where the chat shows it apart from the answer.

Remote chats run the app's MCP tools as local chats do: the chat's tools go to the server as OpenAI
`tools`, the server parses its model's calls, and the streamed `tool_calls` deltas (a call's id and
name first, then its arguments in pieces) are put together here; the last result of a round carries the
complete calls (`tool_calls`, engine.chat.ToolCall), which the chat runs through the same approval and
MCP path as a local chat's calls, then sends their results as `role: tool` messages in the next round.
`RemoteBackend.tool_choice` is what a reply's first round asks: "auto" (the default; vLLM needs
`--enable-auto-tool-choice` and a `--tool-call-parser` for it), "required" or one named function
({"type": "function", "function": {"name": ...}}, which vLLM enforces by guided decoding without a
parser). After tool results, an auto reply stays auto, a forced one is asked to answer ("none").
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from app.core.images import openai_messages
from app.core.remote_client import RemoteClient, RemoteError
from app.core.chat_settings import LOOP_SAFE_DRY, ChatSettings
from engine.chat import ToolCall

_DONE = object()


def api_message(m: dict) -> dict:
    """A chat message as the OpenAI API takes it: a call's arguments as JSON text (templates take them as an
    object), a tool result without the tool's name (OpenAI's tool messages have none). A reply's thinking
    goes back only with its tool rounds (reasoning_content, where a template such as Qwen3's keeps it for
    the turn under way), never with an answer: as vLLM asks, a finished reply's thinking is not resent."""
    if m.get("role") == "tool":
        return {k: v for k, v in m.items() if k != "name"}
    if not m.get("tool_calls"):
        return {k: v for k, v in m.items() if k != "reasoning_content"}
    calls = [{**c, "function": {**c["function"], "arguments": ToolCall.from_openai(c).arguments_json}}
             for c in m["tool_calls"]]
    return {**m, "tool_calls": calls}


def round_tool_choice(choice: str | dict, history: list[dict]) -> str | dict:
    """The tool_choice of one round: the reply's own in its first round; after tool results "auto" stays,
    a forced choice becomes "none" (the call was made, now the answer)."""
    after_results = bool(history) and history[-1].get("role") == "tool"
    return choice if not after_results or choice == "auto" else "none"


def chat_body(model: str, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None,
              tool_choice: str | dict = "auto") -> dict:
    """The chat request for a chat's history and settings; non-OpenAI sampler keys only when not neutral."""
    messages = ([{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []) + \
        [api_message(m) for m in openai_messages(history)]  # attached images as image_url parts (data: URLs)
    body: dict[str, Any] = {"model": model, "messages": messages, "temperature": settings.temperature,
                            "top_p": settings.top_p, "stream_options": {"include_usage": True}}
    if settings.max_new_tokens is not None:  # none: the server's default (until the context is full, usually)
        body["max_tokens"] = settings.max_new_tokens
    if tools:
        body["tools"] = tools
        body["tool_choice"] = round_tool_choice(tool_choice, history)
    if settings.top_k:
        body["top_k"] = settings.top_k  # vLLM, SGLang, llama-server and pagedeck take these three
    if settings.min_p:
        body["min_p"] = settings.min_p
    if settings.repetition_penalty != 1.0:
        body["repetition_penalty"] = settings.repetition_penalty
    if settings.seed is not None:
        body["seed"] = settings.seed
    if settings.stop_strings:
        body["stop"] = list(settings.stop_strings)
    if settings.json_mode:
        body["response_format"] = {"type": "json_object"}  # OpenAI's JSON mode (vLLM, llama-server, pagedeck)
    # The chats' default DRY (LOOP_SAFE_DRY) is left out: it is the local engine's guard against loops, and a
    # remote server has its own defaults; DRY set to anything else is refused with the other extras.
    dry = settings.dry_multiplier > 0 and {k: getattr(settings, k) for k in LOOP_SAFE_DRY} != LOOP_SAFE_DRY
    unsent = [label for label, on in (("DRY", dry), ("mirostat", settings.mirostat),
                                      ("XTC", settings.xtc_probability > 0)) if on]
    if unsent:  # OpenAI-compatible servers have no common name for these: refuse rather than drop them
        raise ValueError(f"{', '.join(unsent)} sampling is not available with a remote server; "
                         "turn it off in the chat settings or use the local model")
    return body


def add_piece(calls: dict[int, dict], piece: dict) -> None:
    """One streamed `tool_calls` delta into the calls so far: the id, type and name come once (OpenAI
    sends them in a call's first delta), the arguments text grows piece by piece."""
    entry = calls.setdefault(int(piece.get("index") or 0), {"id": "", "name": "", "arguments": ""})
    fn = piece.get("function") or {}
    entry["id"] = entry["id"] or str(piece.get("id") or "")
    entry["name"] = entry["name"] or str(fn.get("name") or "")
    args = fn.get("arguments")
    entry["arguments"] += args if isinstance(args, str) else json.dumps(args) if args is not None else ""


class RemoteJob:
    """One streamed reply; `async for r in job` gives engine-style result dicts, cancel() hangs up."""

    def __init__(self, client: RemoteClient, body: dict, identifier: Any = None,
                 loras: list[tuple[str, float]] | None = None):
        self.identifier = identifier
        self.loras = loras  # what the reply records: the adapter its `model` names ([] = base model)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._ended = False
        self._task = asyncio.get_running_loop().create_task(self._read(client, body))

    def __aiter__(self) -> "RemoteJob":
        return self

    async def __anext__(self) -> dict:
        if self._ended:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        if item is _DONE:
            self._ended = True
            raise StopAsyncIteration
        if item.get("eos"):
            self._ended = True
        return item

    async def cancel(self) -> None:
        """Stop reading: closing the connection makes the server cancel the request (and free its cache)."""
        if self._task.done():
            return
        self._task.cancel()
        await asyncio.wait([self._task])
        self._queue.put_nowait(self._result(eos=True, eos_reason="cancelled"))

    def _result(self, **fields: Any) -> dict:
        return {"stage": "streaming", "identifier": self.identifier, "text": "", "eos": False, **fields}

    async def _read(self, client: RemoteClient, body: dict) -> None:
        put = self._queue.put_nowait
        finish, usage, counted, started = None, None, 0, False
        calls: dict[int, dict] = {}  # the streamed tool_calls deltas put together, by index
        thinking = False  # inside the server's reasoning_content: the reply's text wraps it in <think>…</think>
        try:
            async for event in client.stream_chat(body):
                if not started:
                    started = True
                    put({"stage": "started", "identifier": self.identifier, "loras": self.loras})
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or ():
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or ""
                    # A reasoning model's thinking (vLLM's reasoning_content; "reasoning" in newer servers) is
                    # kept in the reply's text between <think> markers, where the chat shows it apart.
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
                    if reasoning:
                        text, thinking = ("" if thinking else "<think>") + reasoning, True
                    elif text and thinking:
                        text, thinking = "</think>" + text, False
                    pieces = delta.get("tool_calls") or ()
                    for piece in pieces:
                        add_piece(calls, piece)
                    if text or pieces:
                        n = 1
                        if usage and usage.get("completion_tokens") is not None and event.get("usage"):
                            n = max(0, int(usage["completion_tokens"]) - counted)  # continuous usage stats
                        counted += n
                        put(self._result(text=text, num_tokens=n))
                    finish = choice.get("finish_reason") or finish
            usage = usage or {}
            details = usage.get("prompt_tokens_details") or {}
            put(self._result(eos=True, eos_reason=finish or "stop", prompt_tokens=usage.get("prompt_tokens"),
                             new_tokens=usage.get("completion_tokens", counted), cached_tokens=details.get("cached_tokens"),
                             tool_calls=[ToolCall(c["id"] or f"call_{i}", c["name"], c["arguments"] or "{}")
                                         for i, c in sorted(calls.items()) if c["name"]]))
        except asyncio.CancelledError:
            raise
        except RemoteError as exc:
            put(exc)
        except Exception as exc:  # noqa: BLE001 - anything else still ends the reply with its reason
            put(RemoteError(f"{type(exc).__name__}: {exc}"))


class RemoteBackend:
    """The Backend for a remote server: `connect()` first; chats use `model` (the base or an adapter id)."""

    ranks_replies = False  # the server schedules its requests itself (vLLM refuses priorities unless started so)

    def __init__(self, url: str, api_key: str | None = None):
        self.client = RemoteClient(url, api_key)
        self.base_model: str | None = None
        self.model: str | None = None
        self.entries: list[dict] = []
        self._jobs: dict[Any, RemoteJob] = {}
        self.tool_choice: str | dict = "auto"  # a reply's first round with tools (see the module docstring)

    @property
    def url(self) -> str:
        return self.client.root

    @property
    def adapters(self) -> list[dict]:
        """/v1/models entries that are adapters of the base model (vLLM lists them with a parent)."""
        return [e for e in self.entries if e.get("parent")]

    async def connect(self) -> dict:
        """Read the server's models; the chats' model is the base one. RemoteError if unreachable."""
        await self.refresh()
        self.model = self.base_model
        return {"url": self.url, "model": self.base_model, "adapters": [e["id"] for e in self.adapters]}

    async def refresh(self) -> list[dict]:
        self.entries = await self.client.models()
        bases = [e for e in self.entries if not e.get("parent")]
        self.base_model = str((bases or self.entries)[0]["id"])
        if self.model is not None and self.model not in {e["id"] for e in self.entries}:
            self.model = self.base_model  # the adapter the chats used was unloaded
        return self.entries

    async def close(self) -> None:
        for identifier in list(self._jobs):
            await self.cancel(identifier)
        await self.client.close()

    def chat_model(self, settings: ChatSettings) -> str:
        """The request's `model`: a chat's own adapter (an OpenAI request names one, at scale 1), the base
        model for (), else the remote LoRA panel's pick."""
        if settings.loras is None:
            return self.model
        if not settings.loras:
            return self.base_model
        if len(settings.loras) > 1 or settings.loras[0][1] != 1.0:
            raise RemoteError("an OpenAI-compatible server takes one adapter per request, at scale 1 "
                              f"(this chat asks for {list(settings.loras)})")
        return settings.loras[0][0]

    # ---- Backend protocol -------------------------------------------------------------------------
    continues_replies = False  # a chat API answers a trailing assistant message with a new turn
    runs_tools = True  # the chat's MCP tools go as OpenAI tools; the server parses its model's calls

    def chat_template(self, settings: ChatSettings | None = None) -> None:
        return None  # the server renders its prompts

    def render_prompt(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> None:
        return None

    def adapter_names(self) -> list[str]:
        return [str(e["id"]) for e in self.adapters]

    def context_limit(self, settings: ChatSettings | None = None) -> None:
        """Unknown: an OpenAI-compatible server does not say its context length (it refuses what is too long)."""
        return None

    def count_tokens(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> None:
        """Unknown: the server's tokenizer and chat template are not here (the usage event counts the prompt)."""
        return None

    def prompt_format(self) -> None:
        """Unknown here: the server renders chats with its own rule."""
        return None

    def sees_images(self, settings: ChatSettings | None = None) -> None:
        """Unknown: /v1/models does not say; a server whose model reads text only answers with a 400."""
        return None

    def image_tokens(self, image: Any, settings: ChatSettings | None = None) -> None:
        """Unknown: the server's vision encoder decides (its usage event counts the prompt, images included)."""
        return None

    async def wait_loaded(self) -> None:
        if self.model is None:
            await self.connect()

    def start_job(self, identifier: Any, history: list[dict], settings: ChatSettings,
                  tools: list[dict] | None = None) -> tuple[RemoteJob, None]:
        if identifier in self._jobs:
            raise RuntimeError(f"chat {identifier} already has a reply running")
        if self.model is None:
            raise RemoteError(f"not connected to {self.url}")
        settings.validate()
        model = self.chat_model(settings)
        loras = [] if model == self.base_model else [(model, 1.0)]
        job = RemoteJob(self.client, chat_body(model, history, settings, tools, self.tool_choice), identifier, loras)
        self._jobs[identifier] = job
        return job, None  # prompt tokens arrive with the usage event

    async def cancel(self, identifier: Any) -> bool:
        job = self._jobs.pop(identifier, None)
        if job is None:
            return False
        await job.cancel()
        return True

    def job_ended(self, identifier: Any) -> None:
        self._jobs.pop(identifier, None)

    @property
    def running(self) -> list:
        return list(self._jobs)

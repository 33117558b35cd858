"""OpenAIServer: an OpenAI-compatible HTTP API over one DynamicGeneratorAsync (aiohttp on the running loop).

aiohttp's AppRunner/TCPSite run on whatever asyncio loop is current, so the desktop app serves from its
qasync loop next to the chats (uvicorn would install its own loop and signal handlers and fight qasync),
and `python -m engine serve` runs the same object headless. Every request becomes one DynamicJobAsync
on the served generator, so API requests batch with each other and with the app's chats, and show on
the page map under their request id. A client that disconnects cancels its job (handler cancellation is
on), so its pages return at once.

Routes: GET /health, GET /v1/models (and /v1/models/{id}), POST /v1/chat/completions, POST /v1/completions,
GET /metrics (Prometheus), GET /pagedeck/pages (the page map as JSON, for pagedeck clients), POST
/v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's runtime LoRA API), GET /openapi.json (their
description, engine.server.openapi). With an api_key every /v1 and /pagedeck route needs
`Authorization: Bearer <key>`; /health, /metrics and /openapi.json stay open, as in vLLM.

With a model pool (engine.server.models_pool, `python -m engine serve`) a request's `model` picks any model
the pool knows, loaded just in time and held while the request runs; /v1/models lists them all and /metrics
labels each model's samples. Without one (the app's Server panel) it serves `served` alone.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..generator.adapters import AdapterUnavailable
from ..generator.async_api import DynamicJobAsync
from ..vision.image_input import ImageLimits
from .errors import ApiError, bad_request
from .image_requests import load_request_images
from .lifetime import request_ttl
from .openapi import openapi_spec
from .prometheus import build_registry
from .request_schemas import served_facts
from .requests import GenerationRequest, parse_request
from .responses import ResponseBuilder, request_id
from .served import ServedModel

log = logging.getLogger(__name__)

# A request without max_tokens generates until the context is full (or a stop): the generator takes pages as
# a reply grows, so a long limit reserves nothing (as vLLM and OpenAI default).
DEFAULT_MAX_TOKENS: int | None = None
OPEN_PATHS = ("/health", "/metrics", "/openapi.json")


class OpenAIServer:
    """Serve `served` (settable at any time; None answers 503) on host:port until stop()."""

    def __init__(self, served: ServedModel | None = None, *, api_key: str | None = None,
                 default_max_tokens: int | None = DEFAULT_MAX_TOKENS, allow_remote_images: bool = False,
                 image_limits: ImageLimits = ImageLimits(), pool: Any = None):
        self.served = served
        self.pool = pool  # engine.server.models_pool.ModelPool: requests may name any of its models
        self.allow_remote_images = allow_remote_images  # image_url parts may name http(s) URLs (fetched here)
        self.image_limits = image_limits
        self.api_key = api_key or None
        self.default_max_tokens = default_max_tokens
        self.requests_total = 0
        self.requests_running = 0
        self._releasing: set[asyncio.Task] = set()  # requests' job releases in flight (held: the loop keeps weak refs)
        self.listeners: list[Callable[[], None]] = []  # called when the request counts change
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self.registry, self._ttft = build_registry(self._metrics_source, pool)
        # 64 MiB: room for a few images as base64 (each is checked against its own limit)
        self.app = web.Application(middlewares=[self._errors, self._auth], client_max_size=64 * 2**20)
        r = self.app.router
        r.add_get("/health", self._health)
        r.add_get("/v1/models", self._models)
        r.add_get("/v1/models/{model:.+}", self._model)
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/completions", self._completion)
        r.add_post("/v1/load_lora_adapter", self._load_lora)
        r.add_post("/v1/unload_lora_adapter", self._unload_lora)
        r.add_get("/metrics", self._metrics)
        r.add_get("/pagedeck/pages", self._pages)
        r.add_get("/openapi.json", self._openapi)

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 8399) -> str:
        """Listen on host:port (0: any free port); returns the base URL, e.g. http://127.0.0.1:8399."""
        if self._runner is not None:
            raise RuntimeError(f"the server is already running at {self.url}")
        # Stopping cancels requests in flight after a short grace (their jobs are cancelled, pages freed).
        runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound = runner.addresses[0]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{bound[1]}"
        return self.url

    async def stop(self) -> None:
        """Stop listening; requests in flight are cancelled (their jobs too)."""
        runner, self._runner = self._runner, None
        self.url = None
        if runner is not None:
            await runner.cleanup()

    @property
    def running(self) -> bool:
        return self._runner is not None

    def _changed(self) -> None:
        for fn in list(self.listeners):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a listener's bug must not fail the request
                log.exception("server listener failed")

    # ---- middleware ------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except ApiError as exc:
            return web.json_response(exc.body(), status=exc.status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = {404: f"no route {request.method} {request.path}",
                       405: f"method {request.method} not allowed on {request.path}"}.get(exc.status, exc.reason)
            return web.json_response(ApiError(exc.status, message).body(), status=exc.status)

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.api_key is not None and request.path not in OPEN_PATHS:
            header = request.headers.get("Authorization", "")
            token = header[7:] if header.startswith("Bearer ") else None
            if token is None or not hmac.compare_digest(token.encode(), self.api_key.encode()):
                raise ApiError(401, "Incorrect API key provided" if token is not None else
                               "Missing API key: send it as 'Authorization: Bearer <key>'", code="invalid_api_key")
        return await handler(request)

    # ---- simple routes ---------------------------------------------------------------------------
    def _served(self) -> ServedModel:
        if self.served is None:
            raise ApiError(503, "no model is loaded yet", code="model_not_loaded")
        return self.served

    async def _health(self, request: web.Request) -> web.Response:
        self._served()
        return web.Response(text="")

    async def _model_list(self) -> list[dict]:
        if self.pool is not None:
            await self.pool.refresh()
            return self.pool.model_entries()
        return self._served().model_entries()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": await self._model_list()})

    async def _model(self, request: web.Request) -> web.Response:
        """OpenAI's retrieve-model: the entry /v1/models lists under this id; 404 naming the ids there are."""
        name = request.match_info["model"]
        data = await self._model_list()
        for entry in data:
            if entry["id"] == name:
                return web.json_response(entry)
        raise ApiError(404, f"The model `{name}` does not exist. Available: {', '.join(e['id'] for e in data)}",
                       "model", "model_not_found")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_spec(self.url, served_facts(self.pool if self.pool is not None
                                                                      else self.served)))

    def _metrics_source(self) -> list[tuple[dict, str, dict]]:
        if self.pool is not None:
            return [(e.served.generator.metrics(), e.name, {"running": e.active, "total": e.requests_total})
                    for e in self.pool.loaded()]
        served = self.served
        if served is None:
            return []
        server = {"running": self.requests_running, "total": self.requests_total}
        return [(served.generator.metrics(), served.name, server)]

    async def _pages(self, request: web.Request) -> web.Response:
        m = self._served().generator.metrics()
        return web.json_response({k: m[k] for k in ("page_size", "pages_total", "page_states", "page_shared",
                                                    "page_owner_identifiers", "loras", "loras_loaded",
                                                    "page_adapters", "adapter_sets")})

    # ---- LoRA adapters (vLLM's runtime API) ---------------------------------------------------------
    async def _load_lora(self, request: web.Request) -> web.Response:
        """Load into the generator (the app's LoRA panel then lists it too); the files are read off the loop."""
        served = self._served()
        body = await _json_body(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise bad_request("load_lora_adapter needs lora_name and lora_path (non-empty strings)")
        if name == served.name or name in served.generator.adapters().folders:
            raise bad_request(f"The lora adapter '{name}' has already been loaded.", "lora_name")
        if not Path(path).is_dir():
            raise ApiError(404, f"LoRA adapter folder {path!r} does not exist", "lora_path")
        try:  # load now, so a broken adapter fails here rather than in a later request
            await served.generator.load_lora(path, name)
        except (OSError, ValueError) as exc:
            raise bad_request(f"cannot load LoRA adapter '{name}': {exc}", "lora_path") from None
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_lora(self, request: web.Request) -> web.Response:
        """New requests can't name it from now on; requests already running with it finish (the generator
        drops it after their last step), so the response does not wait for them."""
        served = self._served()
        body = await _json_body(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or name not in served.adapters:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "lora_name")
        try:
            await served.generator.run_on_worker(lambda g: g.unload_lora(name))
        except ValueError as exc:  # e.g. in the app's default set
            raise bad_request(str(exc), "lora_name") from None
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    # ---- generation ------------------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        t0 = time.perf_counter()
        if self.pool is None:
            served = self._served()
            body = await _json_body(request)
            request_ttl(body)  # checked as in the pool; one model stays loaded whatever it says
            return await self._generate_with(request, kind, served, body, t0)
        body = await _json_body(request)
        ttl = request_ttl(body)
        async with self.pool.use(body.get("model"), ttl) as served:  # loads it first if need be
            return await self._generate_with(request, kind, served, body, t0)

    async def _generate_with(self, request: web.Request, kind: str, served: ServedModel, body: dict,
                             t0: float) -> web.StreamResponse:
        images = await load_request_images(body, served, allow_remote=self.allow_remote_images,
                                           limits=self.image_limits) if kind == "chat" else None
        # with images the vision encoder runs in parse_request: off the event loop, so other streams go on
        req = (await asyncio.to_thread(parse_request, kind, body, served, self.default_max_tokens, images) if images
               else parse_request(kind, body, served, self.default_max_tokens, images))
        builders = ResponseBuilder.choices(req, request_id(kind), served.tokenizer)
        self.requests_total += 1
        self.requests_running += 1
        self._changed()
        jobs: list[DynamicJobAsync] = []
        try:
            for i in range(req.n):  # n jobs on one prompt: the generator prefills it once for all of them
                jobs.append(_start_job(served, req, builders[0].id, i))
            if req.stream:
                return await self._stream(request, req, jobs, builders, t0, served.name)
            return await self._complete(jobs, builders, t0, served.name)
        finally:
            # A lost connection cancels this handler, perhaps again while it waits here (a write may meet
            # the reset before aiohttp's connection_lost does): the release runs as its own task, so every
            # job is cancelled and the count drops whatever happens to the handler.
            release = asyncio.ensure_future(self._release(jobs))
            self._releasing.add(release)
            release.add_done_callback(self._releasing.discard)
            await asyncio.shield(release)

    async def _release(self, jobs: list[DynamicJobAsync]) -> None:
        """Cancel a finished request's jobs (no-op once finished; on disconnect it frees the pages now),
        then count it out."""
        try:
            for job in jobs:
                await job.cancel()
        finally:
            self.requests_running -= 1
            self._changed()

    def _observe_ttft(self, builder: ResponseBuilder, r: dict, t0: float, name: str) -> None:
        if builder.index == 0 and builder.completion_tokens == 0 and r.get("token_ids"):
            self._ttft.labels(name).observe(time.perf_counter() - t0)

    async def _complete(self, jobs: list[DynamicJobAsync], builders: list[ResponseBuilder], t0: float,
                        name: str) -> web.Response:
        async with contextlib.aclosing(_choice_results(jobs)) as results:
            async for i, r in results:
                if r["stage"] != "streaming":
                    continue
                self._observe_ttft(builders[i], r, t0, name)
                builders[i].feed(r)
                if r.get("eos") and r.get("eos_reason") == "cancelled":
                    raise ApiError(503, "the request was cancelled by the server (model unloaded or server stopping)")
        return web.json_response(builders[0].final())

    async def _stream(self, request: web.Request, req: GenerationRequest, jobs: list[DynamicJobAsync],
                      builders: list[ResponseBuilder], t0: float, name: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Request-Id": builders[0].id})
        await resp.prepare(request)

        async def send(obj: dict | str) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
            await resp.write(f"data: {data}\n\n".encode())

        offsets = [0] * len(builders)
        try:
            for b in builders:  # every choice opens with its role chunk (chat) or its echo (completions)
                if req.kind == "chat":
                    await send(b.chunk(first=True))
                elif req.echo:
                    await send(b.chunk(text=req.prompt))
                    offsets[b.index] = len(req.prompt)
            async with contextlib.aclosing(_choice_results(jobs)) as results:
                async for i, r in results:
                    if r["stage"] != "streaming":
                        continue
                    b = builders[i]
                    self._observe_ttft(b, r, t0, name)
                    text, logprobs = b.feed(r)
                    if r.get("eos") and r.get("eos_reason") == "cancelled":
                        raise ApiError(503, "the request was cancelled by the server (model unloaded or server "
                                            "stopping)")
                    if req.kind == "chat":
                        for chunk in _chat_chunks(b, logprobs):
                            await send(chunk)
                    elif text or logprobs:
                        await send(b.chunk(text=text, logprobs=logprobs, text_offset=offsets[i]))
                        offsets[i] += len(text)
                    if r.get("eos"):
                        await send(b.chunk(finish=True))
            if req.include_usage:
                await send(builders[0].usage_chunk())
        except ApiError as exc:  # headers are gone: the error travels as an event, as vLLM sends it
            await send(exc.body())
        except ConnectionResetError:  # the client went away mid-stream: the finally cancels the job
            return resp
        await send("[DONE]")
        await resp.write_eof()
        return resp


def _chat_chunks(builder: ResponseBuilder, logprobs: list[dict]) -> list[dict]:
    """The chunks of one result of a chat: its reasoning, its text (with the tokens' logprobs), its calls'
    pieces."""
    d = builder.delta
    out = []
    if d.reasoning:
        out.append(builder.chunk(reasoning=d.reasoning))
    if d.content or logprobs:
        out.append(builder.chunk(text=d.content, logprobs=logprobs))
    if d.call_pieces:
        out.append(builder.chunk(tool_calls=d.call_pieces))
    return out


def _start_job(served: ServedModel, req: GenerationRequest, rid: str, index: int = 0) -> DynamicJobAsync:
    """The job of choice `index` (its own seed and filters; identified as rid, or rid/index with n > 1)."""
    try:
        return DynamicJobAsync(served.generator, input_ids=req.input_ids, max_new_tokens=req.max_tokens,
                               min_new_tokens=req.min_tokens, gen_settings=req.sampler, seed=req.choice_seed(index),
                               stop_conditions=req.stops, filters=req.choice_filters(index),
                               identifier=rid if req.n == 1 else f"{rid}/{index}", priority=req.priority,
                               return_logits=req.logprobs is not None, loras=served.job_loras(req.adapter),
                               decode_special_tokens=req.plan is not None and req.plan.decode_special,
                               **({"embeddings": req.embeddings} if req.embeddings is not None else {}))
    except AdapterUnavailable as exc:  # unloaded since resolve: as if unknown
        raise _adapter_gone(exc) from None
    except ValueError as exc:  # e.g. prompt + max_tokens needs more pages than the whole cache
        raise bad_request(str(exc), "max_tokens") from None
    except RuntimeError as exc:  # the generator closed: the app is loading another model
        raise ApiError(503, f"the model is being replaced: {exc}", code="model_not_loaded") from None


async def _choice_results(jobs: list[DynamicJobAsync]):
    """(choice index, result) from every choice's job, in the order they arrive; an engine failure in any
    of them ends the whole response."""
    if len(jobs) == 1:
        async for r in _results(jobs[0]):
            yield 0, r
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, job: DynamicJobAsync) -> None:
        try:
            async for r in _results(job):
                queue.put_nowait((i, r, None))
        except ApiError as exc:
            queue.put_nowait((i, None, exc))
        else:
            queue.put_nowait((i, None, None))

    tasks = [asyncio.ensure_future(pump(i, job)) for i, job in enumerate(jobs)]
    try:
        left = len(jobs)
        while left:
            i, r, exc = await queue.get()
            if exc is not None:
                raise exc
            if r is None:
                left -= 1
            else:
                yield i, r
    finally:
        for t in tasks:
            t.cancel()


def _adapter_gone(exc: AdapterUnavailable) -> ApiError:
    """The 404 of a request whose adapter was unloaded after the request named it: as if never loaded."""
    return ApiError(404, f"The model `{exc.name}` does not exist: {exc}", "model", "model_not_found")


async def _results(job: DynamicJobAsync):
    """The job's results; an engine failure becomes a 500-class API error instead of a traceback. An adapter
    unloaded between the job's making and its queueing is the same 404 as one unloaded before."""
    try:
        async for r in job:
            yield r
    except AdapterUnavailable as exc:
        raise _adapter_gone(exc) from None
    except Exception as exc:  # noqa: BLE001 - an engine bug still answers in OpenAI's shape, logged
        log.exception("generation failed")
        raise ApiError(500, f"generation failed: {type(exc).__name__}: {exc}") from None


async def _json_body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body

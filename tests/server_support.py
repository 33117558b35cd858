"""A real OpenAIServer on 127.0.0.1 with its own generator, driven from tests (holds no tests itself).

The server runs on a private event loop thread, exactly as `python -m engine serve` runs it, so the
official (blocking) `openai` client can talk to it from the test thread over real HTTP.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

TIMEOUT = 120


class ServerThread:
    def __init__(self, model_path: str | Path | None = None, *, cache_tokens: int = 4096, page_size: int = 16,
                 api_key: str | None = None, adapters: dict[str, Path] | None = None, serve_model: bool = True,
                 weights: str = "auto", **generator_options: Any):
        self.model_path = model_path
        self.cache_tokens, self.page_size = cache_tokens, page_size
        self.api_key = api_key
        self.adapters = dict(adapters or {})
        self.serve_model = serve_model
        self.weights = weights
        self.generator_options = generator_options
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-server-loop", daemon=True)
        self.server = self.generator = self.served = None
        self.url = ""

    # ---- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> "ServerThread":
        self.thread.start()
        try:
            self.call(self._start())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    async def _start(self) -> None:
        from engine import AdapterRouter, DynamicGeneratorAsync, Model, PagedCache, Tokenizer
        from engine.server import OpenAIServer, ServedModel
        from engine.server.main import model_id

        model = await asyncio.to_thread(Model.load, self.model_path, weights=self.weights)
        tokenizer = Tokenizer.load(self.model_path)
        cache = PagedCache(model, max_tokens=self.cache_tokens, page_size=self.page_size)
        self.generator = DynamicGeneratorAsync(model=model, cache=cache, tokenizer=tokenizer,
                                               **self.generator_options)
        self.served = ServedModel(self.generator, tokenizer, model_id(model), AdapterRouter(self.generator),
                                  dict(self.adapters))
        self.server = OpenAIServer(self.served if self.serve_model else None, api_key=self.api_key)
        self.url = await self.server.start("127.0.0.1", 0)

    def __exit__(self, *exc) -> None:
        async def stop():
            if self.server is not None:
                await self.server.stop()
            if self.generator is not None:
                await self.generator.close()

        if self.thread.is_alive():
            with contextlib.suppress(Exception):
                self.call(stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
        self.loop.close()

    def call(self, coro, timeout: float = TIMEOUT):
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # ---- helpers --------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.served.name

    def client(self, api_key: str | None = None, **kw):
        import openai

        kw.setdefault("timeout", TIMEOUT)
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key or self.api_key or "unused", max_retries=0,
                             **kw)

    def snapshot(self) -> dict:
        return self.generator.metrics()

    @contextlib.contextmanager
    def hold_generator(self):
        """Block the generator's worker between steps (requests queue up) until the block exits."""
        release, holding = threading.Event(), threading.Event()

        def hold(_gen):
            holding.set()
            release.wait(TIMEOUT)

        fut = asyncio.run_coroutine_threadsafe(self.generator.run_on_worker(hold), self.loop)
        holding.wait(TIMEOUT)
        try:
            yield
        finally:
            release.set()
            fut.result(TIMEOUT)


def metric_samples(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text -> {(sample name, sorted labels without model_name): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def metric(text: str, name: str, **labels: str) -> float:
    return metric_samples(text)[(name, tuple(sorted(labels.items())))]

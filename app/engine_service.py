"""The app's one engine: loads models off the UI thread, owns the generator, starts chat jobs, feeds metrics.

Every chat's reply is a DynamicJobAsync on the same DynamicGeneratorAsync, so all chats batch together
(and with API requests when the Server panel serves it). The LoRA panel's set applies to the chats: a
chat reply first asks the engine's AdapterRouter for that set (an API request may have swapped another
in), so no reply ever runs on an adapter it did not ask for.
Loading runs in a worker thread (asyncio.to_thread); the new model replaces the old one only once it
loaded completely, so a bad path or a broken file leaves the previous model serving.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.store import ChatSettings
from engine.contract import DEFAULT_CACHE_TOKENS
from engine.contract import DEFAULT_PAGE_SIZE as PAGE_SIZE
from engine.contract import model_path_problem

log = logging.getLogger(__name__)


@dataclass
class LoadRequest:
    """What the model panel asks for (its load_requested dict, checked)."""

    path: str | None = None
    cache_tokens: int = DEFAULT_CACHE_TOKENS
    kv_quant: str | None = None  # checked by engine.PagedCache (the error reaches load_failed)
    weights: str = "auto"  # engine.Model.load's weights: auto = 4-bit GGUF matmuls on a CPU
    draft_model: str | None = None
    use_ngram: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> "LoadRequest":
        unknown = set(d) - {"path", "cache_tokens", "kv_quant", "weights", "draft_model", "use_ngram"}
        if unknown:
            raise ValueError(f"unknown model load options: {sorted(unknown)}")
        req = cls(**d)
        req.path = req.path or None  # "" from an empty path box means the default model, not "."
        req.draft_model = req.draft_model or None
        if isinstance(req.cache_tokens, bool) or not isinstance(req.cache_tokens, int) or req.cache_tokens < PAGE_SIZE:
            raise ValueError(f"cache_tokens must be an int >= {PAGE_SIZE} (one page), got {req.cache_tokens!r}")
        for prefix, path in (("", req.path), ("draft model: ", req.draft_model)):
            problem = model_path_problem(path) if path is not None else None
            if problem is not None:
                raise FileNotFoundError(prefix + problem)
        return req


class EngineService(QObject):
    """Signals carry plain Python objects so panels never see engine types."""

    load_progress = Signal(float)
    loaded = Signal(object)  # info dict (see _info)
    load_failed = Signal(str)
    metrics = Signal(object)  # generator.metrics() snapshot, ~10 Hz while a model is loaded
    loras_active = Signal(object)  # list of adapter names now applied
    loras_pending = Signal(bool)
    lora_failed = Signal(str)

    def __init__(self, parent: QObject | None = None, metrics_interval_ms: int = 100):
        super().__init__(parent)
        self.model = self.tokenizer = self.cache = self.generator = self.router = None
        self.chat_loras: tuple = ()  # the LoRA panel's applied set: [(adapter path, scale)]
        self.info: dict | None = None
        self.loading = False
        self._load_done: asyncio.Event | None = None  # set when the current load ends, either way
        self._jobs: dict[Any, Any] = {}  # identifier -> running DynamicJobAsync
        self._timer = QTimer(self)
        self._timer.setInterval(metrics_interval_ms)
        self._timer.timeout.connect(self._push_metrics)

    # --- model ---------------------------------------------------------------------------------

    async def load(self, request: LoadRequest | dict | None = None) -> bool:
        """Load a model (None path = the embedded default); False (and load_failed) on any error."""
        if self.loading:
            self.load_failed.emit("a model is already loading; wait for it to finish")
            return False
        self.loading = True
        self._load_done = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            req = request if isinstance(request, LoadRequest) else LoadRequest.from_dict(request or {})

            def progress(fraction: float) -> None:
                loop.call_soon_threadsafe(self.load_progress.emit, float(fraction))

            t0 = time.perf_counter()
            model, tokenizer, cache, draft = await asyncio.to_thread(self._build, req, progress)
            import engine

            options: dict[str, Any] = {}
            if draft is not None:
                options.update(draft_model=draft[0], draft_cache=draft[1])
            if req.use_ngram:
                options["use_ngram_draft"] = True
            generator = engine.DynamicGeneratorAsync(model=model, cache=cache, tokenizer=tokenizer, **options)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the previous model
            log.warning("model load failed: %s", exc)
            kept = f" (still using {self.info['name']})" if self.info else ""
            self.load_failed.emit(f"Could not load model: {type(exc).__name__}: {exc}{kept}")
            return False
        finally:
            self.loading = False
            self._load_done.set()
        await self._retire()
        from engine import AdapterRouter

        self.model, self.tokenizer, self.cache, self.generator = model, tokenizer, cache, generator
        self.router, self.chat_loras = AdapterRouter(generator), ()
        self.info = self._info(req, time.perf_counter() - t0)
        self._timer.start()
        self.loaded.emit(self.info)
        return True

    async def wait_loaded(self) -> None:
        """Return once no load is in progress (replies sent during startup wait here, 'queued')."""
        if self.loading and self._load_done is not None:
            await self._load_done.wait()

    @staticmethod
    def _build(req: LoadRequest, progress) -> tuple:
        """Runs on a worker thread: everything slow (reading weights, allocating the cache)."""
        import engine

        model = engine.Model.load(req.path, progress=progress, weights=req.weights)
        tokenizer = engine.Tokenizer.load(req.path)
        cache = engine.PagedCache(model, max_tokens=req.cache_tokens, page_size=PAGE_SIZE, kv_quant=req.kv_quant)
        draft = None
        if req.draft_model is not None:
            dm = engine.Model.load(req.draft_model)
            draft = (dm, engine.PagedCache(dm, max_tokens=req.cache_tokens, page_size=PAGE_SIZE))
        return model, tokenizer, cache, draft

    def _info(self, req: LoadRequest, seconds: float) -> dict:
        m = self.model
        return {
            "name": m.name,
            "path": str(m.path) if m.path is not None else None,
            "params": m.num_parameters(),
            "memory_bytes": m.memory_bytes() + self.cache.memory_bytes(),
            "device": str(m.device),
            "dtype": str(m.dtype).removeprefix("torch."),
            "cache_tokens": self.cache.max_tokens,
            "pages": self.cache.num_pages,
            "kv_quant": req.kv_quant,
            "weights": m.weight_format,
            "load_seconds": round(seconds, 2),
        }

    async def _retire(self) -> None:
        """Stop every running reply and close the old generator (its consumers see 'cancelled')."""
        old, self.generator = self.generator, None
        for job in list(self._jobs.values()):
            await job.cancel()
        self._jobs.clear()
        if old is not None:
            await old.close()

    async def close(self) -> None:
        self._timer.stop()
        await self._retire()

    # --- jobs ----------------------------------------------------------------------------------

    def prompt_ids(self, history: list[dict], settings: ChatSettings):
        """Chat template over system prompt + history, encoded (the (1, n) ids go straight to the job).
        A trailing assistant message is continued: its text follows the generation prompt, unclosed."""
        if self.tokenizer is None:
            raise RuntimeError("no model is loaded yet")
        partial = history[-1]["content"] if history and history[-1]["role"] == "assistant" else None
        if partial is not None:
            history = history[:-1]
        messages = ([{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []) + history
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True) + (partial or "")
        return self.tokenizer.encode(text, add_bos=False, encode_special_tokens=True)

    continues_replies = True  # prompt_ids continues a trailing assistant message (ChatSession.continue_reply)

    def count_tokens(self, history: list[dict], settings: ChatSettings) -> int:
        return self.prompt_ids(history, settings).shape[-1]

    def context_limit(self) -> int | None:
        """The most tokens one reply's sequence may hold (prompt + reply); None before a model is loaded."""
        return self.generator.generator.max_seq_len if self.generator is not None else None

    def start_job(self, identifier: Any, history: list[dict], settings: ChatSettings):
        """Enqueue one reply; returns (job, prompt token count). Must run on the event loop."""
        if self.generator is None:
            raise RuntimeError("no model is loaded yet" if not self.loading else "the model is still loading")
        if identifier in self._jobs:
            raise RuntimeError(f"chat {identifier} already has a reply running")
        import engine

        ids = self.prompt_ids(history, settings)
        stops = sorted(self.tokenizer.stop_token_ids) + list(settings.stop_strings)
        generator = self.generator
        gen_settings = settings.sampler_settings()

        def make_job():
            # JSON mode: the reply is one JSON object (a fresh filter per job: filters hold the job's state).
            filters = [engine.JSONSchemaFilter({"type": "object"})] if settings.json_mode else None
            return engine.DynamicJobAsync(
                generator, input_ids=ids, max_new_tokens=settings.max_new_tokens, gen_settings=gen_settings,
                seed=settings.seed, stop_conditions=stops, identifier=identifier, filters=filters,
            )

        job = PinnedJob(self.router, self.chat_loras, make_job, identifier)
        self._jobs[identifier] = job
        return job, ids.shape[-1]

    def job_ended(self, identifier: Any) -> None:
        self._jobs.pop(identifier, None)

    async def cancel(self, identifier: Any) -> bool:
        """Cancel a chat's reply; when this returns its pages are back with the generator.
        False if that chat has no job (yet)."""
        job = self._jobs.pop(identifier, None)
        if job is None:
            return False
        await job.cancel()
        return True

    @property
    def running(self) -> list:
        return list(self._jobs)

    # --- LoRA ----------------------------------------------------------------------------------

    async def apply_loras(self, pairs: list[tuple[str, float]]) -> bool:
        """Swap adapters: at once when idle, else pending until running jobs finish (new ones defer)."""
        if self.generator is None:
            self.lora_failed.emit("load a model before applying LoRA adapters")
            return False
        wanted = tuple((str(p), float(s)) for p, s in pairs)
        previous, self.chat_loras = self.chat_loras, wanted
        self.loras_pending.emit(True)
        try:
            await self.router.swap(wanted)
        except Exception as exc:  # noqa: BLE001 - shown in the panel, never raised into the loop
            self.chat_loras = previous
            self.lora_failed.emit(f"Could not apply LoRA set: {type(exc).__name__}: {exc}")
            return False
        finally:
            self.loras_pending.emit(False)
        self.loras_active.emit([Path(p).name for p, _ in wanted])
        return True

    # --- metrics -------------------------------------------------------------------------------

    def snapshot(self) -> dict | None:
        if self.generator is None:
            return None
        m = self.generator.metrics()
        m["deferred_jobs"] += self.router.waiting  # replies waiting for their LoRA set
        return m

    def _push_metrics(self) -> None:
        try:
            snap = self.snapshot()
        except Exception as exc:  # noqa: BLE001 - a dashboard hiccup must not kill the timer
            log.warning("metrics() failed: %s", exc)
            return
        if snap is not None:
            self.metrics.emit(snap)


class PinnedJob:
    """A chat reply that first waits until the generator runs the chat's LoRA set, then streams its job.

    While it waits it reports "deferred" (as a job held back for a swap does); cancel() works in both
    phases, so Stop never waits for somebody else's swap.
    """

    def __init__(self, router, wanted: tuple, make_job, identifier: Any):
        self.router, self.wanted, self.make_job, self.identifier = router, wanted, make_job, identifier
        self.job = None
        self._cancelled: asyncio.Future = asyncio.get_running_loop().create_future()
        self._said_deferred = False
        self._ended = False

    def __aiter__(self) -> "PinnedJob":
        return self

    async def __anext__(self) -> dict:
        if self._ended:
            raise StopAsyncIteration
        if self.job is None:
            if self._cancelled.done():
                return self._cancelled_result()
            if not self.router.ready_for(self.wanted) and not self._said_deferred:
                self._said_deferred = True
                return {"stage": "deferred", "identifier": self.identifier, "eos": False}
            while not self.router.ready_for(self.wanted):  # re-checked after each wait: no await before make_job
                acquire = asyncio.ensure_future(self.router.acquire(self.wanted))
                await asyncio.wait([acquire, self._cancelled], return_when=asyncio.FIRST_COMPLETED)
                if self._cancelled.done():
                    acquire.cancel()
                    return self._cancelled_result()
                acquire.result()  # a failed swap fails this reply (shown under it), never the wrong adapter
            self.job = self.make_job()  # no await since acquire: it runs with the chat's set
        return await self.job.__anext__()

    def _cancelled_result(self) -> dict:
        self._ended = True
        return {"stage": "streaming", "identifier": self.identifier, "text": "", "token_ids": [], "eos": True,
                "eos_reason": "cancelled"}

    async def cancel(self) -> None:
        if not self._cancelled.done():
            self._cancelled.set_result(None)
        if self.job is not None:
            await self.job.cancel()

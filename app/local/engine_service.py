"""The app's one engine: loads models off the UI thread, owns the generator, starts chat jobs, feeds metrics.

Every chat's reply is a DynamicJobAsync on the same DynamicGeneratorAsync, so all chats batch together
(and with API requests when the Server panel serves it). Adapters are per job: the LoRA panel loads
adapters into the generator (its registry is the one list of loaded adapters, also served to API
clients) and sets the default set; a chat whose settings name adapters runs with exactly those, in the
same batch as chats on other adapters, and a chat naming none gets the default set (swapped only while
idle, ExLlamaV2's rule: the panel shows the pending swap).
Loading runs in a worker thread (asyncio.to_thread); the new model replaces the old one only once it
loaded completely, so a bad path or a broken file leaves the previous model serving. A reload keeps the
chats' LoRA set when it fits the new model, and says it was dropped when it does not.
For compare mode more models can be loaded beside the main one (app.local.model_slots): a chat whose
settings name one runs on that model's own generator and cache; the dashboard follows one at a time.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.core.store import ChatSettings
from app.local.chat_jobs import ChatJobs
from app.local.chat_prompt import ChatPrompt
from app.local.gil_share import share_gil_with_ui
from app.local.image_costs import ImageCosts
from app.local.image_prompts import ImagePrompts
from app.local.lora_control import LoraControl
from app.local.model_build import LoadRequest, build_model
from app.local.model_slots import ModelNotLoaded, ModelSlot, ModelsBeside

log = logging.getLogger(__name__)


class EngineService(ChatJobs, ModelsBeside, LoraControl, QObject):
    """Signals carry plain Python objects so panels never see engine types. Its parts live beside it, each
    a mixin over this object's state: chat jobs (app.local.chat_jobs), models beside the main one
    (app.local.model_slots), LoRA adapters (app.local.lora_control); the load itself is app.local.model_build."""

    load_progress = Signal(float)
    load_report = Signal(object)  # engine.contract.LoadProgress: each load stage's start, advance and end
    load_stage = Signal(str)  # what a load is doing now: COMPILING (first start only), then LOADING
    loaded = Signal(object)  # info dict (see _info)
    load_failed = Signal(str)
    metrics = Signal(object)  # generator.metrics() snapshot, ~10 Hz while a model is loaded
    loras_active = Signal(object)  # the default set's adapter names
    loras_loaded = Signal(object)  # names of every adapter loaded into the generator
    loras_pending = Signal(bool)
    lora_failed = Signal(str)
    models_changed = Signal(object)  # models(): every loaded model, the main one first
    chat_format_changed = Signal(object)  # the running model's prompt format (see chat_format_info)

    def __init__(self, parent: QObject | None = None, metrics_interval_ms: int = 100):
        super().__init__(parent)
        self.model = self.tokenizer = self.cache = self.generator = None
        self.vision = None  # the main model's vision encoder (engine.load_vision): it sees images
        self._image_costs = ImageCosts()  # attached images' prompt tokens, per vision encoder
        self._image_prompts = ImagePrompts()  # image prompts made off the loop (prepare_images)
        self.chat_loras: tuple = ()  # the LoRA panel's default set: [(adapter path or name, scale)]
        self.info: dict | None = None
        self.request: dict | None = None  # the LoadRequest (as a dict) of the model running now
        self.loading = False
        self._idle: asyncio.Future | None = None  # resolved when the last running reply ends
        self._closed = False  # after close() no load installs a generator (a waiting load may still finish)
        self._load_done: asyncio.Event | None = None  # set when the current load ends, either way
        self._jobs: dict[Any, Any] = {}  # identifier -> running DynamicJobAsync
        self._prompt: ChatPrompt | None = None  # the last history prompt_ids encoded
        self.beside: dict[str, ModelSlot] = {}  # models loaded beside the main one (compare mode), by path
        self.metrics_model: str | None = None  # whose metrics the dashboard gets (None: the main model)
        self._loading_beside = False
        # model path (None: the default) -> the prompt format chosen for it ("auto": engine's rule); the
        # window points it at the preferences, so a model loads with the format last chosen for it
        self.chat_format_for: Callable[[str | None], str] | None = None
        self._format_problem: str | None = None  # why the remembered choice could not be used
        self._timer = QTimer(self)
        self._timer.setInterval(metrics_interval_ms)
        self._timer.timeout.connect(self._push_metrics)
        share_gil_with_ui()  # the generator thread shares the GIL with this (the Qt) thread

    # --- model ---------------------------------------------------------------------------------

    async def load(self, request: LoadRequest | dict | None = None, *, wait_for_replies: bool = False) -> bool:
        """Load a model (None path = the embedded default); False (and load_failed) on any error.

        The new model replaces the old one when it is ready, stopping replies still running then; with
        wait_for_replies the load starts only once they have ended (replies sent meanwhile queue, as
        during any load, and run on the new model)."""
        if self.loading:
            self.load_failed.emit("a model is already loading; wait for it to finish")
            return False
        self.loading = True
        self._load_done = asyncio.Event()
        kept, kept_paths = self.chat_loras, self._adapter_folders()
        try:
            if not await self._load(request, wait_for_replies):
                return False
        finally:  # replies queued in wait_loaded go on only now, with the new generator (or the old one) in place
            self.loading = False
            self._load_done.set()
        self.loaded.emit(self.info)
        self.models_changed.emit(self.models())
        self.chat_loras = ()
        self.loras_active.emit([])  # what the new generator runs until the set is re-applied
        self.loras_loaded.emit([])
        for name, path in kept_paths.items():  # chats naming an adapter that does not fit fail with its name
            await self.load_adapter(path, f"LoRA {name} dropped: it does not fit {self.info['name']}", name)
        if kept:
            names = ", ".join(Path(p).name for p, _ in kept)
            await self.apply_loras(kept, failed=f"LoRA {names} dropped: it does not fit {self.info['name']}")
        return True

    async def _load(self, request: LoadRequest | dict | None, wait_for_replies: bool) -> bool:
        loop = asyncio.get_running_loop()
        try:
            req = request if isinstance(request, LoadRequest) else LoadRequest.from_dict(request or {})
            if wait_for_replies:
                await self._until_idle()

            def progress(report) -> None:  # on the loading threads: post to the UI thread
                loop.call_soon_threadsafe(self._load_reported, report)

            def stage(text: str) -> None:
                loop.call_soon_threadsafe(self.load_stage.emit, text)

            t0 = time.perf_counter()
            model, tokenizer, cache, draft, vision = await asyncio.to_thread(self._build, req, progress, stage)
            self._format_problem = self._choose_format(tokenizer, req.path)
            import engine

            options: dict[str, Any] = {}
            if draft is not None:
                options.update(draft_model=draft[0], draft_cache=draft[1])
            if req.use_ngram:
                options["use_ngram_draft"] = True
            if self._closed:
                raise RuntimeError("the app is shutting down")
            generator = engine.DynamicGeneratorAsync(model=model, cache=cache, tokenizer=tokenizer, **options)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the previous model
            log.warning("model load failed: %s", exc)
            kept = f" (still using {self.info['name']})" if self.info else ""
            self.load_failed.emit(f"Could not load model: {type(exc).__name__}: {exc}{kept}")
            return False
        await self._retire()
        self.model, self.tokenizer, self.cache, self.generator = model, tokenizer, cache, generator
        self.vision, self.model_can_see_images = vision, vision is not None
        self._prompt = None  # a prompt encoded by the previous tokenizer
        self._image_prompts.clear()
        self.info = self._info(req, time.perf_counter() - t0)
        self.request = asdict(req)
        self._timer.start()
        # the old model went at the swap: give its freed heap (~0.7 GB on the default model) back now, on the
        # generator's thread; its own trims run only after a step, so without a reply it stayed resident
        await generator.run_on_worker(lambda g: g.heap.trim())
        return True

    async def wait_loaded(self) -> None:
        """Return once no load is in progress (replies sent during startup wait here, 'queued')."""
        if self.loading and self._load_done is not None:
            await self._load_done.wait()

    def _load_reported(self, report) -> None:
        self.load_report.emit(report)
        if report.stage == "weights" and report.error is None:
            self.load_progress.emit(float(report.fraction))

    _build = staticmethod(build_model)  # runs on a worker thread (app.local.model_build)

    def _choose_format(self, tokenizer, path: str | None) -> str | None:
        """Apply the prompt format remembered for this model; a choice that no longer works (a custom file
        gone) falls back to the automatic rule, and the reason is returned to be shown."""
        choice = self.chat_format_for(path) if self.chat_format_for is not None else "auto"
        try:
            tokenizer.set_chat_format(choice)
        except ValueError as exc:
            tokenizer.set_chat_format("auto")
            return f"the prompt format chosen for this model is unusable ({exc}); using the automatic one"
        return None

    def chat_format_info(self) -> dict | None:
        """The running model's prompt format: label (one line naming it), short (a few words), choice
        (what was asked for), kind (model / fallback / plain / custom), problem (or None); None before a load."""
        if self.tokenizer is None:
            return None
        f = self.tokenizer.chat_format
        return {"label": f.label, "short": f.short, "choice": f.choice, "kind": f.kind, "problem": self._format_problem}

    def prompt_format(self) -> dict | None:  # Backend
        return self.chat_format_info()

    model_can_see_images = False  # set when the main model loads with a vision encoder (HF VLM, or mmproj beside it)

    def sees_images(self, settings: ChatSettings | None = None) -> bool | None:  # Backend
        """Whether the chat's model sees images (it has a vision encoder); None before any model (unknown yet)."""
        if self.generator is None:
            return None
        slot = self._beside_of(settings)
        return slot.vision is not None if slot is not None else bool(self.model_can_see_images)

    def image_tokens(self, image: Any, settings: ChatSettings | None = None) -> int | None:  # Backend
        """The prompt tokens an attached image costs on the chat's model, from its vision encoder's layout
        (tiles and global view, with their tags); None where the model has no encoder."""
        try:
            tokenizer = self._engine_of(settings)[0]
        except ModelNotLoaded:
            return None
        return self._image_costs.cost(image, tokenizer, self._vision_of(settings))

    def set_chat_format(self, choice: str) -> dict:
        """Use another prompt format for the running model from the next reply on (ValueError: unknown or
        unreadable, the old one kept); chat_format_changed tells the panes."""
        if self.tokenizer is None:
            raise RuntimeError("no model is loaded yet")
        self.tokenizer.set_chat_format(choice)
        self._format_problem = None
        self._prompt = None  # encoded with the old format
        info = self.chat_format_info()
        if self.info is not None:
            self.info["chat_format"] = info["label"]
        self.chat_format_changed.emit(info)
        return info

    def _info(self, req: LoadRequest, seconds: float) -> dict:
        m = self.model
        return {
            "chat_format": self.tokenizer.chat_format.label,
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
        """Stop the main model's running replies and close its generator (their consumers see 'cancelled');
        replies on models beside it go on."""
        old, self.generator = self.generator, None
        for identifier, job in list(self._jobs.items()):
            if job.generator is old:
                job = self._forget_job(identifier)
                if job is not None:  # its consumer may have let it go while an earlier cancel was awaited
                    await job.cancel()
        if old is not None:
            await old.close()

    async def close(self) -> None:
        self._closed = True
        self._timer.stop()
        await self._retire()
        for path in list(self.beside):
            await self.unload_beside(path)

    def replies_on(self, generator=None) -> int:
        """How many chat replies run on `generator` now (None: on every model), for the Server tab and
        the status file."""
        return sum(1 for job in self._jobs.values() if generator is None or job.generator is generator)

    # --- metrics -------------------------------------------------------------------------------

    def snapshot(self) -> dict | None:
        slot = self.beside.get(self.metrics_model) if self.metrics_model is not None else None
        generator = slot.generator if slot is not None else self.generator
        if generator is None:
            return None
        return generator.metrics()

    def _push_metrics(self) -> None:
        try:
            snap = self.snapshot()
        except Exception as exc:  # noqa: BLE001 - a dashboard hiccup must not kill the timer
            log.warning("metrics() failed: %s", exc)
            return
        if snap is not None:
            self.metrics.emit(snap)

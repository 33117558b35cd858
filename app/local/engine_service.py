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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.core.store import ChatSettings
from app.local.chat_prompt import ChatPrompt, has_images, prompt_text
from app.local.image_costs import ImageCosts
from app.local.image_prompts import ImagePrompts
from app.local.model_slots import ModelNotLoaded, ModelSlot, not_loaded
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
        d = {k: v for k, v in d.items() if not (k == "cache_tokens" and v is None)}  # None = the default size
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


COMPILING = "Compiling kernels for this CPU (first start, ~1 min)…"
LOADING = "Loading model…"


class EngineService(QObject):
    """Signals carry plain Python objects so panels never see engine types."""

    load_progress = Signal(float)
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

            def progress(fraction: float) -> None:
                loop.call_soon_threadsafe(self.load_progress.emit, float(fraction))

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
        return True

    async def _until_idle(self) -> None:
        while self._jobs:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle

    def _forget_job(self, identifier: Any):
        job = self._jobs.pop(identifier, None)
        if not self._jobs and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        return job

    async def wait_loaded(self) -> None:
        """Return once no load is in progress (replies sent during startup wait here, 'queued')."""
        if self.loading and self._load_done is not None:
            await self._load_done.wait()

    @staticmethod
    def _build(req: LoadRequest, progress, stage=lambda text: None) -> tuple:
        """Runs on a worker thread: everything slow (compiling the CPU kernels on a first start, reading weights,
        allocating the cache), saying which stage it is in."""
        import engine

        if not engine.cpu_kernels_built():  # once per machine and kernel version: say so, it takes a minute
            stage(COMPILING)
            engine.build_cpu_kernels()
        stage(LOADING)
        # the whole load (weights, cache, activations) against free memory, from headers, before allocating
        engine.check_fits(req.path, cache_tokens=req.cache_tokens, kv_quant=req.kv_quant,
                   weights=req.weights)
        model = engine.Model.load(req.path, progress=progress, weights=req.weights)
        tokenizer = engine.Tokenizer.load(req.path)
        cache = engine.PagedCache(model, max_tokens=req.cache_tokens, page_size=PAGE_SIZE, kv_quant=req.kv_quant)
        draft = None
        if req.draft_model is not None:
            dm = engine.Model.load(req.draft_model)
            draft = (dm, engine.PagedCache(dm, max_tokens=req.cache_tokens, page_size=PAGE_SIZE))
        try:  # an HF VLM's vision tower, or an mmproj beside a GGUF; one that can't load leaves the model text-only
            vision = engine.load_vision(req.path) if req.path is not None else None
        except Exception as exc:  # noqa: BLE001 - the language model still serves text
            log.warning("the vision encoder of %s did not load, the model reads text only: %s", req.path, exc)
            vision = None
        return model, tokenizer, cache, draft, vision

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

    def _beside_of(self, settings: ChatSettings | None) -> ModelSlot | None:
        want = settings.model if settings is not None else None
        return self.beside.get(want) if want is not None and (self.info is None or want != self.info["path"]) else None

    def _vision_of(self, settings: ChatSettings | None) -> Any:
        """The vision encoder of the chat's model (None: it reads text only, or it is not loaded)."""
        slot = self._beside_of(settings)
        return slot.vision if slot is not None else self.vision

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

    # --- models beside the main one -------------------------------------------------------------

    def models(self) -> list[tuple[str | None, str]]:
        """(path, name) of every loaded model: the main one first (path None), then those beside it."""
        main = [(None, self.info["name"])] if self.info is not None else []
        return main + [(path, slot.name) for path, slot in self.beside.items()]

    async def load_beside(self, path: str | Path, cache_tokens: int | None = None) -> bool:
        """Load a second (third...) model with its own generator and cache; False (and load_failed) when it
        cannot load or does not fit in the memory the loaded models leave."""
        path = str(path)
        if self.generator is None or self.info is None:
            self.load_failed.emit("load a main model before loading another beside it")
            return False
        if self.loading or self._loading_beside:
            self.load_failed.emit("a model is already loading; wait for it to finish")
            return False
        if path == self.info["path"] or path in self.beside:
            self.load_failed.emit(f"{Path(path).name} is already loaded")
            return False
        self._loading_beside = True
        try:
            req = LoadRequest.from_dict({"path": path, "cache_tokens": cache_tokens or self.request["cache_tokens"]})
            model, tokenizer, cache, _, vision = await asyncio.to_thread(self._build, req, lambda _f: None)
            import engine

            generator = engine.DynamicGeneratorAsync(model=model, cache=cache, tokenizer=tokenizer)
        except Exception as exc:  # noqa: BLE001 - the models already loaded keep serving
            log.warning("loading a model beside %s failed: %s", self.info["name"], exc)
            self.load_failed.emit(f"Could not load {Path(path).name} beside {self.info['name']}: "
                                  f"{type(exc).__name__}: {exc}")
            return False
        finally:
            self._loading_beside = False
        info = {"name": model.name, "path": path, "params": model.num_parameters(), "cache_tokens": cache.max_tokens,
                "pages": cache.num_pages, "memory_bytes": model.memory_bytes() + cache.memory_bytes()}
        self.beside[path] = ModelSlot(path, tokenizer, cache, generator, info, vision)
        self.models_changed.emit(self.models())
        return True

    async def unload_beside(self, path: str) -> None:
        """Close a model loaded beside the main one (its running replies end as stopped)."""
        slot = self.beside.pop(path, None)
        if slot is None:
            return
        if self.metrics_model == path:
            self.metrics_model = None
        for identifier, job in list(self._jobs.items()):
            if job.generator is slot.generator:
                await self._forget_job(identifier).cancel()
        await slot.generator.close()
        self.models_changed.emit(self.models())

    def show_metrics(self, path: str | None) -> None:
        """The dashboard follows this model's generator (None: the main model)."""
        self.metrics_model = path if path in self.beside else None

    def _engine_of(self, settings: ChatSettings | None) -> tuple[Any, Any]:
        """(tokenizer, generator) of the model these settings name; ModelNotLoaded if it is not loaded."""
        want = settings.model if settings is not None else None
        if want is None or (self.info is not None and want == self.info["path"]):
            return self.tokenizer, self.generator
        slot = self.beside.get(want)
        if slot is None:
            raise not_loaded(want)
        return slot.tokenizer, slot.generator

    # --- jobs ----------------------------------------------------------------------------------

    def prompt_ids(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None):
        """Chat template over system prompt + history, encoded (the (1, n) ids go straight to the job).
        A trailing assistant message is continued: its text follows the generation prompt, unclosed.

        The last history encoded is kept (app.local.chat_prompt): fitting a chat into the context asks
        for that history less its oldest turns, and the job for the one it kept, and those ids are cut
        from it, so a send tokenizes its prompt once."""
        return self._prompt_of(history, settings, tools)[0]

    def _prompt_of(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None):
        """(ids, image embeddings or None): a history with images on a model that sees them goes through
        its vision encoder (engine.image_prompt); otherwise the text prompt (images ignored: with_images
        already turned them into notes for a text-only model)."""
        tokenizer = self._engine_of(settings)[0]
        if tokenizer is None:
            raise RuntimeError("no model is loaded yet")
        vision = self._vision_of(settings)
        if vision is not None and has_images(history):
            return self._image_prompts.of(tokenizer, vision, history, settings, tools)
        return self._text_ids(tokenizer, history, settings, tools), None

    async def prepare_images(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> None:
        """Make a history's image prompt on a worker thread (app.local.image_prompts) for the count and job."""
        try:
            tokenizer = self._engine_of(settings)[0]
        except ModelNotLoaded:
            return  # start_job says which model is missing
        vision = self._vision_of(settings)
        if tokenizer is not None and vision is not None and has_images(history):
            await self._image_prompts.prepare(tokenizer, vision, history, settings, tools)

    def _text_ids(self, tokenizer: Any, history: list[dict], settings: ChatSettings, tools: list[dict] | None):
        last = self._prompt
        if last is not None and last.tokenizer is tokenizer:
            ids = last.ids_of(history, settings, tools)
            if ids is not None:
                return ids
        self._prompt = ChatPrompt(tokenizer, history, settings, tools)
        return self._prompt.ids

    continues_replies = True  # prompt_ids continues a trailing assistant message (ChatSession.continue_reply)
    runs_tools = True  # the chat template renders the tools; the chat parses the model's calls from its text

    def count_tokens(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> int | None:
        """Prompt tokens of that history; None before a model is loaded."""
        try:
            tokenizer = self._engine_of(settings)[0]
        except ModelNotLoaded:
            return None  # the send says which model is missing
        if tokenizer is None:
            return None
        return self.prompt_ids(history, settings, tools).shape[-1]

    def chat_template(self, settings: ChatSettings | None = None) -> str | None:
        """The chat template source of the chat's model (None before it is loaded)."""
        try:
            tokenizer = self._engine_of(settings)[0]
        except ModelNotLoaded:
            return None
        return tokenizer.chat_template if tokenizer is not None else None

    def render_prompt(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> str | None:
        """The prompt's text (a reasoning template may end it inside an open think block)."""
        tokenizer = self._engine_of(settings)[0]
        if tokenizer is None:
            return None
        return prompt_text(tokenizer, history, settings, tools)

    def context_limit(self, settings: ChatSettings | None = None) -> int | None:
        """The most tokens one reply's sequence may hold (prompt + reply) on the chat's model; None before
        a model is loaded (or when the chat's model is not loaded)."""
        try:
            generator = self._engine_of(settings)[1]
        except ModelNotLoaded:
            return None
        return generator.max_seq_len if generator is not None else None

    def start_job(self, identifier: Any, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None):
        """Enqueue one reply; returns (job, prompt token count). Must run on the event loop."""
        if self.generator is None:
            raise RuntimeError("no model is loaded yet" if not self.loading else "the model is still loading")
        if identifier in self._jobs:
            raise RuntimeError(f"chat {identifier} already has a reply running")
        import engine

        tokenizer, generator = self._engine_of(settings)
        ids, embeddings = self._prompt_of(history, settings, tools)
        stops = sorted(tokenizer.stop_token_ids) + list(settings.stop_strings)
        gen_settings = settings.sampler_settings()

        loras = None if settings.loras is None else [tuple(pair) for pair in settings.loras]
        filters = self._filters(settings)
        job = engine.DynamicJobAsync(  # a ValueError names an adapter that isn't loaded
            generator, input_ids=ids, max_new_tokens=settings.max_new_tokens, gen_settings=gen_settings,
            seed=settings.seed, stop_conditions=stops, identifier=identifier, loras=loras, filters=filters,
            stop_on_loops=settings.stop_on_loops, **({"embeddings": embeddings} if embeddings else {}),
        )
        self._jobs[identifier] = job
        return job, ids.shape[-1]

    def _filters(self, settings: ChatSettings) -> list | None:
        """The job's constrained-decoding filters. JSON mode: the reply is one JSON object (a fresh filter per
        job: filters hold the job's state)."""
        import engine

        return [engine.JSONSchemaFilter({"type": "object"})] if settings.json_mode else None

    def job_ended(self, identifier: Any) -> None:
        self._forget_job(identifier)

    async def cancel(self, identifier: Any) -> bool:
        """Cancel a chat's reply; when this returns its pages are back with the generator.
        False if that chat has no job (yet)."""
        job = self._forget_job(identifier)
        if job is None:
            return False
        await job.cancel()
        return True

    @property
    def running(self) -> list:
        return list(self._jobs)

    # --- LoRA ----------------------------------------------------------------------------------

    def loaded_adapters(self) -> list[str]:
        return [] if self.generator is None else list(self.generator.adapters().folders)

    adapter_names = loaded_adapters  # Backend

    def _adapter_folders(self) -> dict[str, str]:
        """name -> folder of every adapter loaded from disk (the panel's or an API client's): a reload loads
        them into the new generator."""
        if self.generator is None:
            return {}
        return {name: folder for name, folder in self.generator.adapters().folders.items() if folder}

    async def load_adapter(self, path: str | Path, failed: str | None = None, name: str | None = None) -> bool:
        """Load a PEFT folder into the generator (read off the loop) under its folder name; a reload loads
        the same folders into the new model."""
        if self.generator is None:
            self.lora_failed.emit("load a model before loading LoRA adapters")
            return False
        try:
            await self.generator.load_lora(str(path), name)
        except Exception as exc:  # noqa: BLE001 - shown in the panel, never raised into the loop
            what = failed or f"Could not load LoRA adapter {Path(path).name}"
            self.lora_failed.emit(f"{what}: {type(exc).__name__}: {exc}")
            return False
        self.loras_loaded.emit(self.loaded_adapters())
        return True

    async def unload_adapter(self, name: str) -> bool:
        """Unload an adapter; returns once its last running reply has ended (new replies can't name it)."""
        if self.generator is None:
            return False
        try:
            await self.generator.unload_lora(name)
        except Exception as exc:  # noqa: BLE001 - e.g. it is in the default set
            self.lora_failed.emit(f"Could not unload LoRA adapter {name}: {exc}")
            return False
        self.loras_loaded.emit(self.loaded_adapters())
        return True

    async def apply_loras(self, pairs: list[tuple[str, float]], failed: str = "Could not apply LoRA set") -> bool:
        """Set the default set (folders or loaded names) for chats that name none: at once when idle, else
        pending until running jobs finish (new default-set replies defer meanwhile)."""
        if self.generator is None:
            self.lora_failed.emit("load a model before applying LoRA adapters")
            return False
        wanted = [(str(p), float(s)) for p, s in pairs]
        previous, self.chat_loras = self.chat_loras, tuple(wanted)
        self.loras_pending.emit(True)
        try:
            await self.generator.set_loras([p for p, _ in wanted] or None, [s for _, s in wanted] or None)
        except Exception as exc:  # noqa: BLE001 - shown in the panel, never raised into the loop
            self.chat_loras = previous
            self.lora_failed.emit(f"{failed}: {type(exc).__name__}: {exc}")
            return False
        finally:
            self.loras_pending.emit(False)
        self.loras_active.emit([name for name, _ in self.generator.adapters().default])
        self.loras_loaded.emit(self.loaded_adapters())
        return True

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

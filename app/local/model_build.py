"""A model load: what the model panel asks for (LoadRequest) and what is built for it off the UI thread.

`build_model` runs on a worker thread (asyncio.to_thread): compiling the CPU kernels on a first start,
checking the whole load fits in free memory, reading the weights, allocating the cache (and a draft
model's), and the vision encoder when the model has one. EngineService installs what it returns only
once everything loaded, so a failure leaves the previous model serving.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

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


def build_model(req: LoadRequest, progress, stage=lambda text: None) -> tuple:
    """Runs on a worker thread: everything slow (compiling the CPU kernels on a first start, reading weights,
    allocating the cache), saying which stage it is in; `progress` gets the model load's
    engine.contract.LoadProgress reports (header, weights, tokenizer), from this thread and the tokenizer's."""
    import engine

    if not engine.cpu_kernels_built():  # once per machine and kernel version: say so, it takes a minute
        stage(COMPILING)
        engine.build_cpu_kernels()
    stage(LOADING)
    # the whole load (weights, cache, activations) against free memory, from headers, before allocating
    engine.check_fits(req.path, cache_tokens=req.cache_tokens, kv_quant=req.kv_quant,
               weights=req.weights)
    model, tokenizer = engine.load_model_and_tokenizer(req.path, progress=progress, weights=req.weights)
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

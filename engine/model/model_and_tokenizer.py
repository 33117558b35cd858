"""load_model_and_tokenizer: a model's weights and its tokenizer, loaded side by side, reporting each stage.

Building a tokenizer from a GGUF's vocabulary is real work (a 262k-token BPE vocabulary: ~0.5 s, most of it the
tokenizers library building its maps) and needs nothing from the weights, so it runs on a helper thread beside
them. The tokenizers library holds the GIL while it builds its BPE model, so the two overlap only where the
weights' loader leaves the GIL free: the loader walks the file's tensors in Python first, queueing their byte
moves, and the tokenizer's build starts when those moves start running in one C++ call
(engine.model.packing.move_queue; `moving`, Model.load's hook). Started at once, the build held the GIL in
stretches of up to ~0.1 s against the loader's few hundred returns to Python.

With a `progress` callback the load reports its stages as engine.contract.LoadProgress: "header" first (the
checkpoint's metadata and tensor table, parsed once and shared with the later readers), then "weights" (its
fraction rising to 1.0, at most about once per 1 % of the tensor bytes) and "tokenizer" at the same time, on
the tokenizer's thread. A stage that fails reports itself with its error before the error is raised. The
callback may therefore be called from two threads; it must be quick and thread-safe (the app posts each
report to its event loop).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from ..contract import LoadProgress, LoadProgressCallback
from .catalog.info import read_model_info
from .model import Model
from .tokenizer import Tokenizer
from .weights import default_model_path

_STEP = 0.01  # weights reports are at least this fraction apart (a 7B GGUF has ~300 tensors, some tiny)


@contextmanager
def _stage(progress: LoadProgressCallback | None, name: str) -> Iterator[float]:
    """Report `name` started, then done with its seconds, or failed with its error (re-raised)."""
    t0 = time.perf_counter()
    if progress is not None:
        progress(LoadProgress(name, 0.0, 0.0))
    try:
        yield t0
    except BaseException as exc:
        if progress is not None:
            progress(LoadProgress(name, 0.0, time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}"))
        raise
    if progress is not None:
        progress(LoadProgress(name, 1.0, time.perf_counter() - t0, done=True))


def _read_header(path: Path) -> None:
    """The header stage: parse the checkpoint's metadata (kept for the weights and tokenizer readers); a file
    this engine cannot read at all fails here, naming why."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such model file or folder")
    info = read_model_info(path)
    if info.config is None:
        problem = info.problem or "not a model this engine reads"
        raise ValueError(problem if str(path) in problem else f"{path}: {problem}")


def _load_tokenizer(path: Path, progress: LoadProgressCallback | None) -> Tokenizer:
    with _stage(progress, "tokenizer"):
        return Tokenizer.load(path)


def load_model_and_tokenizer(path: str | Path | None = None, progress: LoadProgressCallback | None = None,
                             **model_options: Any) -> tuple[Model, Tokenizer]:
    """Model.load(path, **model_options) and Tokenizer.load(path) at once, reporting stages to `progress` (see
    the module docstring). Either one's error is raised (the model's first, once the tokenizer's thread has
    finished)."""
    resolved = Path(path) if path is not None else default_model_path()
    with _stage(progress, "header"):
        _read_header(resolved)
    moving = threading.Event()  # the weights' bytes move without the GIL from here on: the tokenizer starts

    def tokenizer_beside_weights() -> Tokenizer:
        moving.wait()
        return _load_tokenizer(resolved, progress)

    with ThreadPoolExecutor(1, thread_name_prefix="pagedeck-tokenizer") as pool:
        tokenizer = pool.submit(tokenizer_beside_weights)
        try:
            model = _load_weights(resolved, progress, moving.set, model_options)
        finally:
            moving.set()  # a load that failed before its moves: the tokenizer still runs (and reports)
        return model, tokenizer.result()


def _load_weights(path: Path, progress: LoadProgressCallback | None, moving: Callable[[], None],
                  model_options: dict) -> Model:
    with _stage(progress, "weights") as t0:
        last = 0.0

        def weights_progress(fraction: float) -> None:
            nonlocal last
            fraction = min(max(float(fraction), 0.0), 1.0)
            if fraction - last >= _STEP or (fraction >= 1.0 > last):
                last = fraction
                progress(LoadProgress("weights", fraction, time.perf_counter() - t0))

        return Model.load(path, progress=weights_progress if progress is not None else None, moving=moving,
                          **model_options)

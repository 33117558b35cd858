"""load_model_and_tokenizer: a model's weights and its tokenizer, loaded side by side.

Building a tokenizer from a GGUF's vocabulary is real work (a 262k-token BPE vocabulary: ~0.5 s, most of it the
tokenizers library building its maps) and needs nothing from the weights, so it runs on a helper thread while
the weights load, whose repacking runs in C++ with the GIL released. On a Gemma-3-270M-shaped file (2 cores)
`python -m engine bench` timed the load at 0.97 s one after the other and 0.75 s side by side (kernels/PERF.md).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .model import Model
from .tokenizer import Tokenizer


def load_model_and_tokenizer(path: str | Path | None = None, **model_options: Any) -> tuple[Model, Tokenizer]:
    """Model.load(path, **model_options) and Tokenizer.load(path) at once. Either one's error is raised (the
    model's first, once the tokenizer's thread has finished)."""
    with ThreadPoolExecutor(1, thread_name_prefix="pagedeck-tokenizer") as pool:
        tokenizer = pool.submit(Tokenizer.load, path)
        model = Model.load(path, **model_options)
        return model, tokenizer.result()

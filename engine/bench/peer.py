"""The transformers side of `python -m engine bench --peer transformers`: the same prompts through
`model.generate` (eager attention, greedy), batch 1 and as a left-padded static batch.

transformers is a test-only dependency, so it is imported here, lazily, and only when asked for.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from .measure import sync

if TYPE_CHECKING:
    from .workload import Workload


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("--peer transformers needs the `transformers` package (a test-only dependency): "
                          "pip install 'pagedeck[test]' or pip install transformers") from None
    return transformers


def load_peer(model_arg: str | None, device: torch.device, dtype: torch.dtype, synthetic: bool = False):
    """AutoModelForCausalLM on the same weights (GGUF via transformers' own dequantizer)."""
    tf = _transformers()
    if synthetic:
        from .synthetic import hf_config

        with torch.device(device):
            model = tf.AutoModelForCausalLM.from_config(hf_config(model_arg), dtype=dtype, attn_implementation="eager")
        return model.eval()
    from ..model.weights import default_model_path

    path = Path(model_arg) if model_arg is not None else default_model_path()
    kwargs = dict(dtype=dtype, attn_implementation="eager")
    if path.suffix.lower() == ".gguf":
        model = tf.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs)
    else:
        model = tf.AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    return model.to(device).eval()


class _Stamps:
    """A generate() streamer that only records when each step's tokens arrive (first put = the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class TransformersPeer:
    """transformers' model loaded once; run() is one measurement set (engine.bench alternates them)."""

    name = "transformers"

    def __init__(self, model_arg: str | None, w: "Workload", device: torch.device, dtype: torch.dtype,
                 synthetic: bool = False, log: Callable[[str], None] = print):
        t = time.perf_counter()
        self.model = load_peer(model_arg, device, dtype, synthetic)
        self.load_s = time.perf_counter() - t
        self.w, self.device, self.log = w, device, log
        log(f"transformers: loaded in {self.load_s:.2f} s")
        eos = self.model.config.eos_token_id
        self.pad = int(eos[0] if isinstance(eos, list) else eos or 0)
        log("transformers: warm-up")
        self.generate([w.single[:16]], 8)
        self.generate([w.ttft_first[:256]], 2)

    def generate(self, prompts: list[list[int]], n: int, streamer=None) -> float:
        """Seconds for one generate() of exactly n greedy tokens per prompt (left-padded batch)."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        sync(self.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, pad_token_id=self.pad, streamer=streamer)
        sync(self.device)
        elapsed = time.perf_counter() - t0
        if out.shape[1] - width != n:
            raise RuntimeError(f"transformers generated {out.shape[1] - width} tokens, expected {n}")
        return elapsed

    def run(self) -> dict:
        w, log = self.w, self.log
        log(f"transformers: batch-1 decode ({len(w.single)}-token prompt, {w.new_tokens} new tokens)")
        stamps = _Stamps()
        self.generate([w.single], w.new_tokens, streamer=stamps)
        gen_times = stamps.times[1:]  # the first put is the prompt itself
        b1 = (len(gen_times) - 1) / (gen_times[-1] - gen_times[0]) if len(gen_times) > 1 else 0.0

        log(f"transformers: static batch of {len(w.streams)}")
        streams_s = self.generate(w.streams, w.new_tokens)

        log("transformers: TTFT (no prefix cache: the shared prefix is recomputed)")
        uncached = [self.generate([w.ttft_first], 1) for _ in range(3)]
        second = [self.generate([w.ttft_second], 1) for _ in range(3)]
        return {
            "batch1_tok_s": b1,
            "streams_tok_s": len(w.streams) * w.new_tokens / streams_s,
            "prefill_tok_s": len(w.ttft_first) / statistics.median(uncached),
            "ttft_uncached_ms": statistics.median(uncached) * 1000,
            "ttft_cached_ms": statistics.median(second) * 1000,
        }

    def close(self) -> None:
        del self.model

    note = "transformers has no prefix cache: its 'cached' TTFT recomputes the shared prefix"


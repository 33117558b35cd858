"""Where a decode step's time goes, by op class:
`python -m tools.bench.step_profile [--weights packed] [--batches 1,8] [--threads 1] [--clock cpu|wall] [--per-op]
[--context 150] [--kv-dtype float32|float16]`.

B sequences with ~--context-token prompts (150 by default; sequence b has b more) are prefilled (not
measured), then decode steps of Model.forward run
with the model's kernels wrapped by timers (classes below); what no wrapper sees (embedding, the final norm,
Python between the calls) is `other`. `--clock cpu` counts this thread's CPU time, which a busy shared
machine disturbs far less than wall time; it sees only the calling thread, so use it with --threads 1.
The wrappers cost ~1 us per call, included in the profiled step (the table also gives the unwrapped step).
--kv-dtype float16 builds the K/V pools in fp16 whatever the model's dtype (the fused CPU attention reads
either), to see what the step's attention costs at half the bytes a position.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

import kernels

from engine.cache.paged_cache import PagedCache
from engine.contract import WEIGHT_NAMES
from engine.model import model as model_module
from engine.model.batch import Batch
from engine.model import moe_kernel
from engine.model.model import Model
from engine.model.qlinear import PackedLinear

PROMPT = 150
PAGE = 256
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


@contextmanager
def timed(model: Model, clock, into: dict[str, float]):
    """Wrap the model's kernels so each call adds its time to `into[class]`; restores them on exit. A call
    made inside another wrapped call counts only in the outer one."""
    depth = [0]

    def wrap(fn, name_of):
        def inner(*args, **kwargs):
            if depth[0]:
                return fn(*args, **kwargs)
            depth[0] += 1
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                into[name_of(*args, **kwargs)] += clock() - t
                depth[0] -= 1
        return inner

    def linear_class(x, w, *args, **kwargs) -> str:
        if w is model.lm_head:
            return "output head"
        return f"matmul ({w.format})" if isinstance(w, PackedLinear) else "matmul (dense)"

    classes = {"rms_norm": "norms", "fused_attention": "attention (fused: rotary, K/V write, attention)",
               "silu_mul": "elementwise (silu * up)", "plan_step": "step plan (rotary tables, attention plan)",
               "decode_layers": "all layers in one call (kernels.decode_layers)",
               "apply_rotary": "rotary", "write_kv": "K/V write", "paged_attention": "attention (SDPA)"}
    saved = [(model_module, "linear")] + [(kernels, name) for name in classes if hasattr(kernels, name)]
    classes["experts"] = "experts (mixture of experts: gate|up, SwiGLU, down, weighted sum)"
    saved.append((moe_kernel, "experts"))
    originals = [getattr(obj, name) for obj, name in saved]
    model_module.linear = wrap(originals[0], linear_class)
    for (obj, name), fn in zip(saved[1:], originals[1:]):
        setattr(obj, name, wrap(fn, lambda *a, _c=classes[name], **k: _c))
    methods = {"_head": "output head", "_attention": "attention (reference: split, rotary, write, SDPA)"}
    for name, cls in methods.items():
        if hasattr(model, name):
            setattr(model, name, wrap(getattr(model, name), lambda *a, _c=cls, **k: _c))
    try:
        yield
    finally:
        for (obj, name), fn in zip(saved, originals):
            setattr(obj, name, fn)
        for name in methods:
            model.__dict__.pop(name, None)


def pages_per_sequence(prompt: int, batch: int) -> int:
    return -(-(prompt + batch + 64) // PAGE)


def decode_setup(model: Model, batch: int, prompt: int = PROMPT,
                 kv_dtype: torch.dtype | None = None) -> tuple[PagedCache, list[list[int]]]:
    """A cache (pools of kv_dtype, else the model's) holding `batch` prefilled sequences of prompt + b tokens
    on their own pages."""
    pages = pages_per_sequence(prompt, batch)
    spec = model.cache_spec()
    if kv_dtype is not None:
        spec = dataclasses.replace(spec, dtype=kv_dtype)
    cache = PagedCache(spec, max_tokens=batch * pages * PAGE, page_size=PAGE)
    g = torch.Generator().manual_seed(0)
    seqs = []
    for b in range(batch):
        ids = torch.randint(100, 20000, (prompt + b,), generator=g).tolist()
        table = list(range(b * pages, (b + 1) * pages))
        model.forward(Batch.build([(ids, 0, table)], PAGE, [1], model.device, [True]), cache)
        seqs.append(ids)
    return cache, seqs


def step_batch(model: Model, seqs: list[list[int]], step: int, prompt: int = PROMPT) -> Batch:
    pages = pages_per_sequence(prompt, len(seqs))
    entries = [([s[-1]], len(s) - 1 + step, list(range(b * pages, (b + 1) * pages))) for b, s in enumerate(seqs)]
    return Batch.build(entries, PAGE, [1] * len(seqs), model.device, [False] * len(seqs))


def profile(model: Model, batch: int, steps: int, clock_name: str, prompt: int = PROMPT,
            kv_dtype: torch.dtype | None = None) -> dict:
    clock = CLOCKS[clock_name]
    cache, seqs = decode_setup(model, batch, prompt, kv_dtype)
    batches = [step_batch(model, seqs, s + 1, prompt) for s in range(2 * steps + 4)]
    for b in batches[:4]:  # warm-up
        model.forward(b, cache)
    plain = []
    for b in batches[4 : 4 + steps]:
        t = clock()
        model.forward(b, cache)
        plain.append(clock() - t)
    per_class: dict[str, float] = defaultdict(float)
    profiled = []
    with timed(model, clock, per_class):
        for b in batches[4 + steps :]:
            t = clock()
            model.forward(b, cache)
            profiled.append(clock() - t)
    total = sum(profiled)
    classes = {k: 1e3 * v / steps for k, v in per_class.items()}
    classes["other (embedding, final norm, Python between calls)"] = 1e3 * (total - sum(per_class.values())) / steps
    return {"batch": batch, "clock": clock_name, "context": prompt, "kv_dtype": str(cache.spec.dtype).removeprefix("torch."),
            "step_ms": statistics.median(plain) * 1e3,
            "profiled_step_ms": 1e3 * total / steps,
            "classes_ms": dict(sorted(classes.items(), key=lambda kv: -kv[1]))}


def format_profile(r: dict) -> str:
    lines = [f"batch {r['batch']}, contexts {r['context']}+, {r['kv_dtype']} K/V: step {r['step_ms']:.1f} ms "
             f"{r['clock']} time ({r['profiled_step_ms']:.1f} ms with the timers)", "| op class | ms / step | share |", "| --- | --- | --- |"]
    for cls, ms in r["classes_ms"].items():
        lines.append(f"| {cls} | {ms:.2f} | {100 * ms / r['profiled_step_ms']:.0f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.step_profile", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--weights", choices=WEIGHT_NAMES, default="packed")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    ap.add_argument("--per-op", action="store_true",
                    help="run packed decode steps layer by layer, kernel by kernel (the same kernels and bits as "
                         "kernels.decode_layers' one call) to see each kernel's share")
    ap.add_argument("--context", type=int, default=PROMPT, help="prompt tokens of each sequence (sequence b: b more)")
    ap.add_argument("--kv-dtype", choices=("float32", "float16"), default=None,
                    help="the K/V pools' element type (default: the model's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu sees the calling thread only: use it with --threads 1")
    torch.set_num_threads(args.threads)
    model = Model.load(args.model, weights=args.weights)
    if model.settle_thread is not None:  # its background collapse of the weights' pages would be timed too
        model.settle_thread.join()
    if args.per_op:
        model.decode_stack = None  # no one-call stack: Model.forward takes its per-layer path
    out = []
    with torch.inference_mode():
        for b in (int(x) for x in args.batches.split(",")):
            r = profile(model, b, args.steps, args.clock, args.context,
                        getattr(torch, args.kv_dtype) if args.kv_dtype else None)
            out.append(r)
            print(format_profile(r), flush=True)
    if args.json:
        print(json.dumps({"weights": model.weight_format, "threads": args.threads, "profiles": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a decode step's time goes, by op class: `python -m engine.bench_profile [--weights q4] [--batches 1,8]`.

B sequences with ~150-token prompts are prefilled (not measured), then decode steps of Model.forward run
under torch.profiler. Every op's *self* time is put in a class (by op name and, for matmuls, by the width
of their weight: the output head is told apart by its vocabulary rows); what the profiler does not see
inside forward (Python, argument checks, dispatch) is `python/other`. The profiler itself adds ~1-2 us per
op, so the table also gives the same steps' wall time without the profiler.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

from .batch import Batch
from .cache import PagedCache
from .model import WEIGHT_FORMATS, Model

PROMPT = 150
PAGE = 256

# op name -> class; matched on the profiler's event name (first hit wins)
CLASSES = [
    ("pagedeck::qmatmul", "matmul (packed)"),
    ("pagedeck::head", "output head"),
    ("pagedeck::attention", "attention"),
    ("pagedeck::", "fused small ops"),
    ("_weight_int4pack_mm", "matmul (packed)"),
    ("_weight_int8pack_mm", "matmul (packed)"),
    ("scaled_dot_product", "attention"),
    ("flash_attention", "attention"),
    ("rms_norm", "norms"),
    ("index_copy", "kv write"),
    ("index_select", "gather/index"),
    ("embedding", "gather/index"),
    ("silu", "elementwise"),
    ("mul", "elementwise"),
    ("add", "elementwise"),
    ("sub", "elementwise"),
    ("cos", "elementwise"),
    ("sin", "elementwise"),
    ("_to_copy", "dtype casts/copies"),
    ("copy_", "dtype casts/copies"),
    ("clone", "dtype casts/copies"),
    ("contiguous", "dtype casts/copies"),
    ("cat", "dtype casts/copies"),
]
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")


def classify(name: str, shapes) -> str:
    if name in MATMULS:
        wide = any(s and len(s) == 2 and max(s) >= 32000 for s in shapes or [])
        return "output head" if wide else "matmul (dense)"
    for key, cls in CLASSES:
        if key in name:
            return cls
    return "other aten ops"


def decode_setup(model: Model, batch: int) -> tuple[PagedCache, list[list[int]]]:
    """A cache holding `batch` prefilled ~PROMPT-token sequences on their own pages."""
    pages = -(-(PROMPT + 64) // PAGE)
    cache = PagedCache(model, max_tokens=batch * pages * PAGE, page_size=PAGE)
    g = torch.Generator().manual_seed(0)
    seqs = []
    for b in range(batch):
        ids = torch.randint(100, 20000, (PROMPT + b,), generator=g).tolist()
        table = list(range(b * pages, (b + 1) * pages))
        model.forward(Batch.build([(ids, 0, table)], PAGE, [1], model.device, [True]), cache)
        seqs.append(ids)
    return cache, seqs


def step_batch(model: Model, seqs: list[list[int]], step: int) -> Batch:
    pages = -(-(PROMPT + 64) // PAGE)
    entries = [([s[-1]], len(s) - 1 + step, list(range(b * pages, (b + 1) * pages))) for b, s in enumerate(seqs)]
    return Batch.build(entries, PAGE, [1] * len(seqs), model.device, [False] * len(seqs))


def profile(model: Model, batch: int, steps: int) -> dict:
    cache, seqs = decode_setup(model, batch)
    batches = [step_batch(model, seqs, s + 1) for s in range(2 * steps + 4)]
    for b in batches[:4]:  # warm-up
        model.forward(b, cache)
    wall = []
    for b in batches[4 : 4 + steps]:
        t = time.perf_counter()
        model.forward(b, cache)
        wall.append(time.perf_counter() - t)
    acts = torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[acts], record_shapes=True) as prof:
        t = time.perf_counter()
        for b in batches[4 + steps :]:
            model.forward(b, cache)
        prof_wall = (time.perf_counter() - t) / steps
    per_class: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for e in prof.events():
        cls = classify(e.name, e.input_shapes)
        per_class[cls] += e.self_cpu_time_total / 1e3 / steps  # ms per step
        counts[cls] += 1
    seen = sum(per_class.values())
    per_class["python/other (not in an op)"] = max(0.0, prof_wall * 1e3 - seen)
    return {"batch": batch, "step_ms": statistics.median(wall) * 1e3, "profiled_step_ms": prof_wall * 1e3,
            "ops_per_step": sum(counts.values()) / steps,
            "classes_ms": dict(sorted(per_class.items(), key=lambda kv: -kv[1]))}


def format_profile(r: dict) -> str:
    lines = [f"batch {r['batch']}: step {r['step_ms']:.1f} ms ({r['profiled_step_ms']:.1f} ms under the profiler, "
             f"{r['ops_per_step']:.0f} ops a step)", "| op class | ms / step | share |", "| --- | --- | --- |"]
    total = r["profiled_step_ms"]
    for cls, ms in r["classes_ms"].items():
        lines.append(f"| {cls} | {ms:.2f} | {100 * ms / total:.0f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench_profile", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--weights", choices=WEIGHT_FORMATS, default="q4")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = Model.load(args.model, weights=args.weights)
    out = []
    with torch.inference_mode():
        for b in (int(x) for x in args.batches.split(",")):
            r = profile(model, b, args.steps)
            out.append(r)
            print(format_profile(r), flush=True)
    if args.json:
        print(json.dumps({"weights": model.weight_format, "threads": args.threads, "profiles": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

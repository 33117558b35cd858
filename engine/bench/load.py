"""`python -m engine bench-load MODEL [--weights auto] [--threads 2]`: what loading a model costs and how fast
it decodes: resident memory (the mapped file's pages included) once loaded, at the peak of loading, the weights'
settling and the decode steps (sampled every 20 ms), and after them, against the file size; batch-1 decode step time against the
weight-bandwidth roofline, once the weights have settled in the background (engine.model.settle: their kernel
layouts, then 2 MB pages). One process, one model.

For big files where `python -m engine bench`'s TTFT runs take too long on a CPU (e.g. tools.models.synthetic_gguf's
7B-shaped Q4_K_M layers).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import torch

from ..cache.paged_cache import PagedCache
from ..contract import WEIGHT_NAMES
from ..model.batch import Batch
from ..model.catalog.memory import estimate_memory
from ..model.model import Model
from .measure import read_bandwidth
from .serving import decode_weight_bytes


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine bench-load", description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--weights", default="auto", choices=WEIGHT_NAMES)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--while-moving", action="store_true",
                    help="decode at once, while the weights still settle (the first seconds a user sees), and "
                         "print every step")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    estimate = estimate_memory(args.model, weights=args.weights).weights_bytes
    base = peak = _rss_bytes()
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_bytes())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    model = Model.load(args.model, weights=args.weights)
    load_s = time.perf_counter() - t0
    loaded = _rss_bytes()
    moved = ""
    mover = model.settle_thread
    if mover is not None and not args.while_moving:  # the steady state: decode once the weights have settled
        t = time.perf_counter()
        mover.join()
        moved = f"; weights settled {time.perf_counter() - t:.1f} s later"
    cache = PagedCache(model, max_tokens=512, page_size=256)
    prompt = list(range(100, 116))
    model.forward(Batch.build([(prompt, 0, [0, 1])], 256, [len(prompt)]), cache)
    steps = []
    for i in range(args.steps):
        batch = Batch.build([([7 + i], len(prompt) + i, [0, 1])], 256, [1])
        t = time.perf_counter()
        model.forward(batch, cache)
        steps.append(time.perf_counter() - t)
    step = statistics.median(steps[len(steps) // 4:])
    done.set()
    sampler.join()
    after = _rss_bytes()
    if args.while_moving:
        still = mover is not None and mover.is_alive()
        print(f"steps while moving ({'still moving after them' if still else 'the move done meanwhile'}): "
              + " ".join(f"{s * 1e3:.0f}" for s in steps) + " ms")
    bandwidth, weight_bytes = read_bandwidth(model.device), decode_weight_bytes(model)
    file_bytes = Path(args.model).stat().st_size if Path(args.model).is_file() else sum(
        f.stat().st_size for f in Path(args.model).glob("*.safetensors"))
    roofline = bandwidth / weight_bytes
    print(f"{model.name}: {model.weight_format} weights, {model.config.num_layers} layers, "
          f"loaded in {load_s:.1f} s{moved}, {torch.get_num_threads()} threads")
    print(f"decode: {step * 1e3:.1f} ms a step = {1 / step:.2f} tok/s; {weight_bytes / 1e6:.0f} MB of weights a token at "
          f"{bandwidth / 1e9:.1f} GB/s read bandwidth -> roofline {roofline:.2f} tok/s ({100 / step / roofline:.0f}% of it)")
    print(f"resident memory (file pages included): +{(loaded - base) / 1e6:.0f} MB once loaded, +{(peak - base) / 1e6:.0f} "
          f"MB at the peak of loading, settling and {args.steps} decode steps ({(peak - base) / file_bytes:.2f}x the {file_bytes / 1e6:.0f} MB file), "
          f"+{(after - base) / 1e6:.0f} MB after ({(after - base) / file_bytes:.2f}x); "
          f"weights {model.memory_bytes() / 1e6:.0f} MB ({model.memory_bytes() / file_bytes:.2f}x; estimated before "
          f"loading: {estimate / 1e6:.0f} MB)")
    return 0


"""`python -m tools.bench.reload_memory`: what reloading a model leaves resident, with the load's large blocks
mapped on their own (engine.model.heap.loading_heap, the engine's way) and without (glibc's dynamic rule).

Each side runs in its own process, alternating: it loads the model (default: the embedded one) with its
tokenizer and a PagedCache of --cache-tokens on a worker thread, as the app does, then --reloads times builds
the next one before it drops the previous one (as a reload swaps them), collects garbage, trims the heap and
prints the anonymous resident memory (RssAnon) above the first load's. Growth that levels off is the C heap's
fragmentation; growth by about the model's size each time would be a model left behind.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

_SIDE = """
import contextlib, gc, json, sys
from concurrent.futures import ThreadPoolExecutor
import engine
import engine.model.loader as loader
from engine.model.heap import release_freed_memory
from engine.model.model_and_tokenizer import load_model_and_tokenizer

path, cache_tokens, reloads, mapped = sys.argv[1] or None, int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
weights = sys.argv[5]
if not mapped:
    loader.loading_heap = contextlib.nullcontext

def anon_mb():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["RssAnon"].split()[0]) / 1024

def build():
    model, tokenizer = load_model_and_tokenizer(path, weights=weights)
    return model, tokenizer, engine.PagedCache(model, max_tokens=cache_tokens)

with ThreadPoolExecutor(1) as pool:  # loads on one worker thread, as the app's event loop runs them
    held = pool.submit(build).result()
    gc.collect()
    release_freed_memory()
    first, grew = anon_mb(), []
    for _ in range(reloads):
        new = pool.submit(build).result()
        held = new  # the previous model, tokenizer and cache go here
        del new
        gc.collect()
        release_freed_memory()
        grew.append(anon_mb() - first)
print(json.dumps({"model_mb": held[0].memory_bytes() / 2**20, "grew": grew}))
"""


def run_side(model: str | None, cache_tokens: int, reloads: int, mapped: bool, weights: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _SIDE, model or "", str(cache_tokens), str(reloads),
                          "1" if mapped else "0", weights], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.reload_memory", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a .gguf file or model folder (default: the embedded model)")
    ap.add_argument("--weights", default="auto", help="Model.load's weights (auto: packed on a CPU, as the app loads)")
    ap.add_argument("--cache-tokens", type=int, default=8 * 512)
    ap.add_argument("--reloads", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2, help="processes per side, alternating")
    args = ap.parse_args(argv)
    sides = {"large blocks mapped while loading": True, "glibc's dynamic rule": False}
    runs: dict[str, list[list[float]]] = {name: [] for name in sides}
    model_mb = 0.0
    for _ in range(args.repeats):
        for name, mapped in sides.items():
            got = run_side(args.model, args.cache_tokens, args.reloads, mapped, args.weights)
            runs[name].append(got["grew"])
            model_mb = got["model_mb"]
    print(f"RssAnon above the first load after each of {args.reloads} reloads (MB; the model holds {model_mb:.0f} "
          f"MB), median of {args.repeats} processes per side:")
    for name, grew in runs.items():
        med = [statistics.median(g[i] for g in grew) for i in range(args.reloads)]
        print(f"  {name:36s} " + " ".join(f"{x:5.1f}" for x in med) + f"   last {med[-1]:.1f}, most {max(med):.1f}")


if __name__ == "__main__":
    main()

"""pagedeck vs llama.cpp in CPU time, one thread each: `python -m tools.bench.cpu_time_peer [--weights packed]`.

On a shared machine wall time measures the neighbours (a load average of 20 on 2 cores made a 10 ms step
take 350 ms); the CPU time a single-threaded process spends on the same work barely moves with load. Both
sides run one thread (torch.set_num_threads(1), llama.cpp n_threads=1) in this process and are timed with
time.process_time (every thread of the process: the sampler's threads too), alternating, medians of
--repeats. It measures work, not parallel speed-up: `python -m engine bench --peer llama.cpp` on a quiet
machine gives the wall-clock figures with 2 threads.

Measured: a decode step at batch 1 and 8 (sequences of ~150 cached tokens), and the bench's 8-stream run
end to end (8 prompts of 128 down to ~72 tokens, prefill included, --new-tokens each, greedy).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from engine.bench.llamacpp import LlamaCpp
from engine.cache.paged_cache import PagedCache
from engine.contract import WEIGHT_NAMES, SamplerSettings
from engine.generator.generator import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.model.model import Model
from engine.model.tokenizer import Tokenizer
from engine.model.weights import default_model_path
from tools.bench.step_profile import decode_setup, step_batch

STEPS = 16
PROMPT = 150  # tools.bench.step_profile's context


def stream_prompts(n: int, p: int, seed: int = 1234) -> list[list[int]]:
    """engine.bench's stream lengths: p down to ~p/2."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, 20000, (max(1, p - (i * p) // (2 * n)),), generator=g).tolist() for i in range(n)]


def ours_decode(model: Model, batch: int) -> float:
    cache, seqs = decode_setup(model, batch)
    batches = [step_batch(model, seqs, s + 1) for s in range(STEPS + 4)]
    times = []
    for b in batches:
        t = time.process_time()
        model.forward(b, cache)
        times.append(time.process_time() - t)
    return statistics.median(times[4:])


def peer_decode(runner: LlamaCpp, batch: int) -> float:
    runner.clear()
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(100, 20000, (PROMPT + b,), generator=g).tolist() for b in range(batch)]
    for s, ids in enumerate(seqs):
        runner.decode([(s, ids, 0)])
    toks, times = [ids[-1] for ids in seqs], []
    for i in range(STEPS + 4):
        t = time.process_time()
        toks = runner.decode([(s, [toks[s]], len(seqs[s]) + i) for s in range(batch)])
        times.append(time.process_time() - t)
    return statistics.median(times[4:])


def ours_streams(model: Model, tok: Tokenizer, prompts: list[list[int]], new: int) -> float:
    cache = PagedCache(model, max_tokens=len(prompts) * 256, page_size=256)
    gen = DynamicGenerator(model, cache, tok)
    jobs = [DynamicJob(torch.tensor([p]), new, gen_settings=SamplerSettings.greedy()) for p in prompts]
    t = time.process_time()
    gen.enqueue(jobs)
    while gen.num_remaining_jobs():
        gen.iterate()
    return time.process_time() - t


def peer_streams(runner: LlamaCpp, prompts: list[list[int]], new: int) -> float:
    runner.clear()
    t = time.process_time()
    toks = runner.decode([(s, p, 0) for s, p in enumerate(prompts)])
    for i in range(new - 1):
        toks = runner.decode([(s, [toks[s]], len(p) + i) for s, p in enumerate(prompts)])
    return time.process_time() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.cpu_time_peer", description=__doc__.splitlines()[0])
    ap.add_argument("--weights", choices=WEIGHT_NAMES, default="packed")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, tok = Model.load(weights=args.weights), Tokenizer.load()
    runner = LlamaCpp(default_model_path(), n_ctx=4096, n_seq=max(8, args.streams), threads=1)
    prompts = stream_prompts(args.streams, args.prompt_tokens)
    rows = {"decode step, batch 1 (ms)": (lambda: ours_decode(model, 1), lambda: peer_decode(runner, 1)),
            f"decode step, batch {args.streams} (ms)": (lambda: ours_decode(model, args.streams),
                                                       lambda: peer_decode(runner, args.streams)),
            f"{args.streams} streams end to end, {args.new_tokens} new each (ms)":
                (lambda: ours_streams(model, tok, prompts, args.new_tokens),
                 lambda: peer_streams(runner, prompts, args.new_tokens))}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    try:
        with torch.inference_mode():
            for name, (ours, peer) in rows.items():
                ours(), peer()  # warm-up
                for _ in range(args.repeats):  # alternate
                    runs[name].append((1e3 * ours(), 1e3 * peer()))
    finally:
        runner.close()
    print(f"CPU time, 1 thread each, {model.weight_format} weights, medians of {args.repeats} "
          f"({time.strftime('%Y-%m-%d')}):")
    print("| | pagedeck | llama.cpp | llama.cpp / pagedeck |")
    print("| --- | --- | --- | --- |")
    medians = {}
    for name, rs in runs.items():
        o, p = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
        medians[name] = {"pagedeck_ms": o, "llama_cpp_ms": p, "speedup": p / o}
        print(f"| {name} | {o:.1f} | {p:.1f} | {p / o:.2f}x |")
    if args.json:
        print(json.dumps({"weights": model.weight_format, "medians": medians, "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

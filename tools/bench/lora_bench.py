"""Decode-step cost of LoRA adapters on the default model, measured interleaved in one process.

    python -m tools.bench.lora_bench [--batch 1 8 32] [--context 512] [--rounds 15]
    python -m tools.bench.lora_bench --per-job [--chats 8] [--distinct 0 1 2 4] [--rank 16] [--prefill 128]
                               [--threads 1 --clock cpu]

The first form: one adapter set for every row (LoRASet, `set_loras`). The second: every chat
its own adapter, `--chats` chats spread over 0, 1, 2, 4 distinct adapters, built each step by the
generator's own code (Adapters.step -> LoRABatch), against no LoRA at all. `--prefill N` adds one chat's
N-token prompt chunk to the step (the torch path runs every row through every adapter of the step).

Interleaving matters on a shared machine: every configuration is timed in each round, so load from other
processes hits all of them alike, and the per-configuration median over rounds is compared as a ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from engine import Model, PagedCache
from engine.contract import WEIGHT_NAMES, demo_adapters_folder, find_adapters
from engine.generator.adapters import Adapters
from engine.model.batch import Batch
from engine.model.lora import MODULES, Geometry, LoRA, LoRASet


def random_adapter(model: Model, rank: int, name: str, seed: int) -> LoRA:
    """Worst case for cost: every module of every layer."""
    g = torch.Generator().manual_seed(seed)
    geometry = Geometry.of(model)
    tensors = {}
    for layer in range(model.config.num_layers):
        for m in MODULES:
            parent = "mlp" if m in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            _, n_in, n_out, _ = geometry.module(m)
            key = f"base_model.model.model.layers.{layer}.{parent}.{m}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, n_in, generator=g) * 0.01
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, rank, generator=g) * 0.01
    return LoRA.from_state_dict({"r": rank, "lora_alpha": rank}, tensors, model, name=name)


def decode_batch(model: Model, cache: PagedCache, batch: int, context: int, prefill: int = 0) -> Batch:
    """`batch` sequences decoding one token at `context`, the first feeding a `prefill`-token chunk instead."""
    pages_per_seq = -(-(context + prefill) // cache.page_size)
    seqs = [([7] * (prefill if b == 0 and prefill else 1), context - 1,
             list(range(b * pages_per_seq, (b + 1) * pages_per_seq))) for b in range(batch)]
    return Batch.build(seqs, cache.page_size, None, model.device)


def interleaved(configs: dict[str, Callable[[], None]], rounds: int, steps: int,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds per call of each config, every config timed once per round (round 0 warms up)."""
    times: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(rounds + 1):
        for name, fn in configs.items():
            t0 = clock()
            for _ in range(steps):
                fn()
            if r:
                times[name].append((clock() - t0) / steps)
    return {name: statistics.median(ts) for name, ts in times.items()}


def shared_sets(model: Model, args) -> None:
    demos = [LoRA.load(f, model) for f in find_adapters(demo_adapters_folder())]
    sets = {"none": None, "all layers r16": LoRASet.build(model, random_adapter(model, 16, "r16", 0))}
    if demos:
        sets[f"demo {demos[0].name}"] = LoRASet.build(model, demos[0])
        sets["demo x" + str(len(demos))] = LoRASet.build(model, demos, 0.5)
    for batch in args.batch:
        cache = PagedCache(model, max_tokens=batch * -(-args.context // 256) * 256, page_size=256)
        step = decode_batch(model, cache, batch, args.context)
        med = interleaved({name: (lambda s=s: model.forward(step, cache, lora=s)) for name, s in sets.items()},
                          args.rounds, args.steps, CLOCKS[args.clock])
        for name, m in med.items():
            print(f"batch {batch:3d}  {name:16s} {m * 1e3:8.2f} ms/step  x{m / med['none']:.3f}")


def per_job(model: Model, args) -> None:
    """Each chat its own adapter: the generator's step path, `--chats` rows over k distinct adapters."""
    registry = Adapters(model)
    loras = [registry.load(random_adapter(model, args.rank, f"r{args.rank}-{i}", seed=i)) for i in range(max(args.distinct))]
    rows = args.chats + (args.prefill - 1 if args.prefill else 0)
    cache = PagedCache(model, max_tokens=args.chats * -(-(args.context + args.prefill) // 256) * 256, page_size=256)
    step = decode_batch(model, cache, args.chats, args.context, args.prefill)
    row_counts = [args.prefill or 1] + [1] * (args.chats - 1)

    def config(k: int) -> Callable[[], None]:
        # chat i runs adapter i * k // chats: equal sets side by side, as the generator lays out its steps
        # (k = 0: every chat names loras=[])
        sets = [(n, ((loras[i * k // args.chats], 1.0),) if k else ()) for i, n in enumerate(row_counts)]
        return lambda: model.forward(step, cache, lora=registry.step(sets))

    configs = {"no LoRA": lambda: model.forward(step, cache)}
    configs.update({f"{k} distinct": config(k) for k in args.distinct})
    med = interleaved(configs, args.rounds, args.steps, CLOCKS[args.clock])
    print(f"{args.chats} chats, {rows} rows per step, context {args.context}, adapters r{args.rank} on every module "
          f"of every layer ({_lora_mib(model, loras[0]):.1f} MiB each)")
    one = med.get("1 distinct")
    print("| adapters | ms/step | vs no LoRA | vs 1 adapter |\n| --- | --- | --- | --- |")
    for name, m in med.items():
        vs_one = f"x{m / one:.3f}" if one else "-"
        print(f"| {name} | {m * 1e3:.2f} | x{m / med['no LoRA']:.3f} | {vs_one} |")


def _lora_mib(model: Model, lora: LoRA) -> float:
    return sum(a.numel() + b.numel() for a, b, _ in lora.weights.values()) * model.dtype.itemsize / 2**20


# "cpu": this process's CPU time, which time spent descheduled by other processes does not inflate (use it
# with --threads 1 on a shared machine; with more threads it also counts threads spinning at barriers).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=3, help="decode steps per timing")
    p.add_argument("--weights", default="dense", choices=WEIGHT_NAMES)
    p.add_argument("--per-job", action="store_true", help="each chat its own adapter (the per-job table)")
    p.add_argument("--chats", type=int, default=8)
    p.add_argument("--distinct", type=int, nargs="+", default=[0, 1, 2, 4])
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prefill", type=int, default=0, help="one chat feeds a prompt chunk of this many tokens")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="what to time (cpu: see CLOCKS)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = Model.load(weights=args.weights)
    print(f"{model.name} ({model.weight_format}) on {model.device}, {torch.get_num_threads()} threads")
    if args.per_job:
        if max(args.distinct) > args.chats or min(args.distinct) < 0:
            p.error("--distinct values must lie in 0..--chats")
        per_job(model, args)
    else:
        shared_sets(model, args)


if __name__ == "__main__":
    main()

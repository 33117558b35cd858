"""Decode-step cost of active LoRA adapters on the default model, measured interleaved in one process.

    python -m tools.lora_bench [--batch 1 8 32] [--context 512] [--rounds 15]

Interleaving matters on a shared machine: every configuration is timed in each round, so load from other
processes hits all of them alike, and the per-configuration median over rounds is compared as a ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine import Model, PagedCache
from engine.model.batch import Batch
from engine.contract import demo_adapters_folder, find_adapters
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


def decode_batch(model: Model, cache: PagedCache, batch: int, context: int) -> Batch:
    pages_per_seq = -(-context // cache.page_size)
    seqs = [([7], context - 1, list(range(b * pages_per_seq, (b + 1) * pages_per_seq))) for b in range(batch)]
    return Batch.build(seqs, cache.page_size, None, model.device)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=3, help="decode steps per timing")
    args = p.parse_args(argv)
    model = Model.load()
    demos = [LoRA.load(f, model) for f in find_adapters(demo_adapters_folder())]
    configs = {"none": None, "all layers r16": LoRASet.build(model, random_adapter(model, 16, "r16", 0))}
    if demos:
        configs[f"demo {demos[0].name}"] = LoRASet.build(model, demos[0])
        configs["demo x" + str(len(demos))] = LoRASet.build(model, demos, 0.5)
    print(f"{model.name} on {model.device}, {torch.get_num_threads()} threads, context {args.context}")
    for batch in args.batch:
        cache = PagedCache(model, max_tokens=batch * -(-args.context // 256) * 256, page_size=256)
        step = decode_batch(model, cache, batch, args.context)
        times: dict[str, list[float]] = {name: [] for name in configs}
        for r in range(args.rounds + 1):
            for name, lora_set in configs.items():
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    model.forward(step, cache, lora=lora_set)
                if r:  # round 0 warms up
                    times[name].append((time.perf_counter() - t0) / args.steps)
        base = statistics.median(times["none"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"batch {batch:3d}  {name:16s} {med * 1e3:8.2f} ms/step  x{med / base:.3f}")


if __name__ == "__main__":
    main()

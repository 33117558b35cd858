"""(A helper of tools.bench.qmatmul_bench, not a command.) q8 rows against the same rows regrouped (q8g), on a random
matrix of an output head's shape (`python -m tools.bench.qmatmul_bench --q8-groups 262144x640 --rows 1,2,4,8,16
--threads 2`).

Both layouts give the same bits; the rounds alternate them call by call so a shared machine's load meets both
alike. Figures: wall ms a call, medians.
"""
from __future__ import annotations

import statistics
import time

import torch

from engine.model.qlinear import Q8Linear


def run(shape: str, rows: list[int], threads: int, rounds: int) -> int:
    torch.set_num_threads(threads)
    N, K = (int(v) for v in shape.lower().split("x"))
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    flat = Q8Linear(codes, (torch.rand(N, K // 32, generator=g) * 0.01 + 1e-4).half(), keep_dense=False)
    grouped = Q8Linear(codes, flat.scale.clone(), keep_dense=False)
    if not grouped.group():
        raise SystemExit(f"{N} rows cannot be grouped here (N % 32, or no CPU kernels)")
    print(f"q8 {N} x {K}, {threads} thread(s), wall ms a call, medians of {rounds} alternating rounds")
    print("| rows | row order | q8g | ratio |")
    print("| --- | --- | --- | --- |")
    for m in rows:
        x = torch.randn(m, K, generator=g)
        times: dict[str, list[float]] = {"rows": [], "groups": []}
        for _ in range(rounds):
            for name, w in (("rows", flat), ("groups", grouped)):
                t = time.perf_counter()
                w(x)
                times[name].append(time.perf_counter() - t)
        a, b = statistics.median(times["rows"]), statistics.median(times["groups"])
        print(f"| {m} | {a * 1e3:.2f} | {b * 1e3:.2f} | {a / b:.2f}x |")
    return 0

"""(A helper of tools.bench.qmatmul_bench, not a command.) One-row calls of the q6 format (GGUF Q6_K super-blocks,
kernels/cpu/q6.h) against q8, what Q6_K matrices were re-quantized to before, on random Q6_K matrices of
Llama-3-8B's shapes (`python -m tools.bench.qmatmul_bench --q6 --threads 2`).

The q8 matrix is the q6 one re-quantized exactly as the loader did (kernels/cpu/repack.cpp's q6_k_to_q8);
the rounds alternate the two so a shared machine's load meets both alike. Figures: process CPU time per call
(what the kernel costs, whatever else runs) and wall time, medians; GB/s = the bytes a call streams / wall.
"""
from __future__ import annotations

import statistics
import time

import torch

SHAPES = {"down (4096x14336)": (4096, 14336), "head (128256x4096)": (128256, 4096)}


def random_q6(N: int, K: int):
    from engine.model.qlinear import Q6Linear

    g = torch.Generator().manual_seed(N + K)
    raw = torch.randint(0, 256, (N * K // 256, 210), generator=g, dtype=torch.uint8)
    raw[:, 208:210] = (torch.rand(raw.shape[0], generator=g) * 1e-3).half().view(torch.uint8).view(-1, 2)
    return Q6Linear(raw.view(N, -1))


def run(rows: int, threads: int, rounds: int) -> int:
    from engine.model.qlinear import Q8Linear

    torch.set_num_threads(threads)
    times: dict = {}
    for name, (N, K) in SHAPES.items():
        q6 = random_q6(N, K)
        pair = {"q6": q6, "q8": Q8Linear.requantize(q6)}
        x = torch.randn(rows, K)
        reps = 3 if N > 100000 else 20
        for _ in range(rounds):
            for fmt, w in pair.items():
                w(x)
                c0, w0 = time.process_time(), time.perf_counter()
                for _ in range(reps):
                    w(x)
                times.setdefault((name, fmt), []).append(((time.process_time() - c0) / reps,
                                                          (time.perf_counter() - w0) / reps, w.nbytes()))
        del pair, q6
    print(f"{rows}-row calls, {threads} thread(s), medians of {rounds} alternating rounds")
    print("| matrix | format | bytes | CPU ms a call | wall ms | GB/s (wall) | GB/s (CPU time / threads) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (name, fmt), runs in times.items():
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        nbytes = runs[0][2]
        print(f"| {name} | {fmt} | {nbytes / 1e6:.0f} MB | {cpu * 1e3:.2f} | {wall * 1e3:.2f} | "
              f"{nbytes / wall / 1e9:.1f} | {nbytes / (cpu / threads) / 1e9:.1f} |")
    return 0

"""(A helper of tools.bench.qmatmul_bench, not a command.) The prompt-rows (GEMM) path of pagedeck's packed matmul
against its per-weight-row path, on random Q4 (or, `--gemm-format q6|q5k|iq4xs`, Q6_K, Q5_K or IQ4_XS super-blocks kept
as the loader keeps them: 16-row groups on AVX-512 VNNI builds) matrices of Llama-3-8B's shapes (or `--gemm-shapes
qwen2.5-1.5b`'s) (`python -m tools.bench.qmatmul_bench --prompt-rows 128,512 --threads 1 [--gemm-format q6]`).

Both paths compute the same bits (kernels.cpu_ext.set_tuning picks one per call); the rounds alternate them so a
shared machine's load meets both alike. Figures: process CPU time per call (what the kernel costs, whatever
else runs) and wall time, medians; int8 multiply-adds per CPU second (M x N x K / cpu time).
"""
from __future__ import annotations

import statistics
import time

import torch

from kernels import cpu_ext
from kernels.packed import ACTIVATIONS

SHAPE_SETS = {  # a model's matrices: name -> (N, K, epilogue)
    "llama3-8b": {"o (4096x4096)": (4096, 4096, None), "gate_up (28672x4096, swiglu)": (28672, 4096, "swiglu"),
                  "down (4096x14336)": (4096, 14336, None)},
    "qwen2.5-1.5b": {"qkv (2048x1536)": (2048, 1536, None), "gate_up (17920x1536, swiglu)": (17920, 1536, "swiglu"),
                     "down (1536x8960)": (1536, 8960, None)},
}
PATHS = {"per-row": 1000000000, "gemm": 1}  # rows from which the GEMM path runs


def random_q4(N: int, K: int):
    from engine.model.qlinear import Q4Linear

    g = torch.Generator().manual_seed(N + K)
    scale = (torch.rand(N, K // 32, generator=g) * 0.02 + 0.001).half()
    return Q4Linear(torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8), scale, -8 * scale.float())


def random_superblocks(cls, halves: tuple[int, ...], N: int, K: int):
    """Random super-blocks of cls (every code and scale) with small finite fp16 fields at the byte offsets in
    halves, kept as the loader keeps them (16-row groups where this build has their group kernel)."""
    g = torch.Generator().manual_seed(N + K)
    raw = torch.randint(0, 256, (N * K // 256, cls.BLOCK_BYTES), generator=g, dtype=torch.uint8)
    for at in halves:
        raw[:, at:at + 2] = (torch.rand(raw.shape[0], generator=g) * 1e-3).half().view(torch.uint8).view(-1, 2)
    return cls(raw.reshape(N, -1))


def random_q6(N: int, K: int):
    from engine.model.qlinear import Q6Linear

    return random_superblocks(Q6Linear, (208,), N, K)


def random_q5k(N: int, K: int):
    from engine.model.qlinear.superblock import Q5KLinear

    return random_superblocks(Q5KLinear, (0, 2), N, K)


def random_iq4xs(N: int, K: int):
    from engine.model.qlinear import IQ4XSLinear

    return random_superblocks(IQ4XSLinear, (0,), N, K)


FORMATS = {"q4": random_q4, "q6": random_q6, "q5k": random_q5k, "iq4xs": random_iq4xs}


def run(ops, rows: list[int], threads: int, rounds: int, fmt: str = "q4", shapes: str = "llama3-8b") -> int:
    torch.set_num_threads(threads)
    weights = {name: (FORMATS[fmt](N, K), act, N, K) for name, (N, K, act) in SHAPE_SETS[shapes].items()}
    times: dict = {}
    for _ in range(rounds):
        for m in rows:
            for name, (w, act, N, K) in weights.items():
                x = torch.randn(m, K)
                for path, rows_from in PATHS.items():
                    cpu_ext.set_tuning(qgemm_rows=rows_from)
                    ops.qmatmul(x, *w.blocks, w.kernel_id, ACTIVATIONS[act])
                    c0, w0 = time.process_time(), time.perf_counter()
                    ops.qmatmul(x, *w.blocks, w.kernel_id, ACTIVATIONS[act])
                    times.setdefault((m, name, path), []).append((time.process_time() - c0,
                                                                  time.perf_counter() - w0))
    cpu_ext.set_tuning()  # the environment's switches again
    formats = sorted({w.format for w, *_ in weights.values()})
    print(f"{fmt} packed matmul ({', '.join(formats)}), {shapes}'s shapes, {threads} thread(s), medians of {rounds} "
          "alternating rounds")
    print("| rows | matrix | path | CPU ms a call | wall ms | int8 GMAC/s (CPU time) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (m, name, path), runs in times.items():
        N, K = SHAPE_SETS[shapes][name][:2]
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        print(f"| {m} | {name} | {path} | {cpu * 1e3:.0f} | {wall * 1e3:.0f} | {m * N * K / cpu / 1e9:.1f} |")
    return 0

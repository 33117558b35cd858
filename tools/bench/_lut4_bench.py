"""(A helper of tools.bench.qmatmul_bench, not a command.) One-row calls of the mxfp4 format (GGUF MXFP4 blocks,
kernels/cpu/lut4.h) against q8 on the same bytes, as a batch-1 MoE step makes them: random matrices of
gpt-oss-20b's expert [gate | up] shape (5760 x 2880), 24 of them (4 experts a token, 6 layers: 212 MB, past
every cache, so the weights come from DRAM) against 12 q8 ones of the same total bytes
(`python -m tools.bench.qmatmul_bench --mxfp4 --threads 1,2`).

Each round calls every matrix once per format in turn, formats alternating round by round; figures are wall
medians, GB/s = the bytes of the matrices / wall. A format whose kernel keeps up with memory reads at q8's
rate; one that is compute-bound falls below it.
"""
from __future__ import annotations

import statistics
import time

import torch

N, K, MXFP4_MATRICES = 5760, 2880, 24


def _matrices() -> dict[str, list[tuple]]:
    from kernels.formats import MXFP4, Q8
    from kernels.packed import NO_SCALES, padded_scales

    g = torch.Generator().manual_seed(0)
    nb = K // 32
    mx = []
    for _ in range(MXFP4_MATRICES):
        blocks = torch.randint(0, 256, (N, nb, 17), generator=g, dtype=torch.uint8)
        blocks[:, :, 0] = torch.randint(118, 126, (N, nb), generator=g, dtype=torch.uint8)  # exponents ~2^-6
        mx.append((blocks.reshape(N, -1), NO_SCALES, None, MXFP4.kernel_id))
    q8 = [(torch.randint(0, 256, (N, K), generator=g, dtype=torch.uint8), padded_scales(N, nb).fill_(0.01), None,
           Q8.kernel_id) for _ in range(MXFP4_MATRICES // 2)]
    return {"mxfp4": mx, "q8": q8}


def run(ops, threads: list[int], rounds: int) -> int:
    mats = _matrices()
    x = torch.randn(1, K)
    nbytes = {f: sum(m[0].numel() + m[1].numel() * m[1].element_size() for m in ms) for f, ms in mats.items()}
    times: dict = {}
    for _ in range(rounds):
        for t in threads:
            torch.set_num_threads(t)
            for fmt, ms in mats.items():
                for m in ms:  # warm the call path, not the caches: 212 MB pass through them
                    ops.qmatmul(x, *m, 0)
                w0 = time.perf_counter()
                for m in ms:
                    ops.qmatmul(x, *m, 0)
                times.setdefault((t, fmt), []).append(time.perf_counter() - w0)
    print(f"one-row calls on {len(mats['mxfp4'])} x ({N} x {K}) mxfp4 and {len(mats['q8'])} q8 matrices of the "
          f"same bytes, medians of {rounds} rounds")
    print("| threads | format | bytes | ms (wall) | GB/s |")
    print("| --- | --- | --- | --- | --- |")
    for (t, fmt), runs in sorted(times.items()):
        wall = statistics.median(runs)
        print(f"| {t} | {fmt} | {nbytes[fmt] / 1e6:.0f} MB | {wall * 1e3:.2f} | {nbytes[fmt] / wall / 1e9:.1f} |")
    return 0

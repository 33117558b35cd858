"""Prompt rows through dense fp32 weights against the packed int8 kernels, one chunk at a time:
`python -m tools.bench.prompt_rows_bench [--model FILE] [--rows 8,32,128,512,1024] [--rounds 3]`.

One process, one loaded model (weights="packed"): a 1024-token prefix is prefilled, then chunks of each row
count at position 1024 run through Model.forward flagged as prompt rows (the model's dense prompt rows where
engine.model.packing.repack's rule gives it them: decoded just in time, or a kept copy under PAGEDECK_DENSE_COPY=1)
and flagged as generated rows (the packed kernels), alternating, medians of `rounds`. A model without dense
prompt rows runs the packed kernels both ways (a ratio near 1: the noise floor).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.cache.paged_cache import PagedCache
from engine.model.batch import Batch
from engine.model.model import Model

PREFIX, PAGE = 1024, 256


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.prompt_rows_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: the embedded model)")
    ap.add_argument("--rows", default="8,32,128,512,1024", help="chunk sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(v) for v in args.rows.split(",")]
    model = Model.load(args.model, weights="packed", check_memory=False)
    cache = PagedCache(model, max_tokens=-(-(PREFIX + max(sizes)) // PAGE) * PAGE, page_size=PAGE)
    pages = list(range(cache.num_pages))
    ids = torch.randint(20, min(20000, model.vocab_size), (PREFIX + max(sizes),),
                        generator=torch.Generator().manual_seed(0)).tolist()

    def forward(start: int, n: int, prompt: bool) -> float:
        batch = Batch.build([(ids[start:start + n], start, pages)], PAGE, [1], model.device, [prompt])
        t = time.perf_counter()
        model.forward(batch, cache, None, model.rotary_for(start + n))
        return (time.perf_counter() - t) * 1000

    forward(0, PREFIX, False)
    print(f"{args.model or 'default model'}: dense prompt rows {'on' if model.prompt_dense else 'off'}, "
          f"{args.threads} threads, medians of {args.rounds}")
    print("| rows | prompt rows (ms) | packed kernels (ms) | prompt / packed |\n| --- | --- | --- | --- |")
    for n in sizes:
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.rounds):
            for prompt in (True, False) if r % 2 == 0 else (False, True):
                times[prompt].append(forward(PREFIX, n, prompt))
        dense, packed = statistics.median(times[True]), statistics.median(times[False])
        print(f"| {n} | {dense:.1f} | {packed:.1f} | {dense / packed:.2f} |", flush=True)


if __name__ == "__main__":
    main()

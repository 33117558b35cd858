"""`python -m engine bench --alternatives N`: what N replies to one prompt cost against one reply.

Three runs on the same prompt (--prompt-tokens random ids, --new-tokens sampled tokens each, no stop, each
reply seeded on its own so the N differ): one reply alone; N replies at once (one generator, N jobs on the
prompt: it is prefilled once and its pages are shared, the N decode in the same steps); and N replies one
after another (regenerating N times: the prompt is found in the cache after the first). Each run starts
from an empty prompt cache. Reported: wall time to the last reply's end, and the prompt tokens the
model computed (the prefill the N-at-once run shares). Medians of --repeats runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ..cache.paged_cache import PagedCache
from ..contract import SamplerSettings, check_model_path
from ..generator.generator import DynamicGenerator
from ..generator.job import DynamicJob
from ..model.model import Model
from ..model.tokenizer import Tokenizer

PAGE = 256
SAMPLED = SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, token_repetition_penalty=1.0)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _timed(gen: DynamicGenerator, batches: list[list[DynamicJob]]) -> tuple[float, int]:
    """Run each batch of jobs to its end, one batch after another; (seconds, prompt tokens computed)."""
    gen.reset_page_table()
    before = gen.counters.prefill_tokens_total
    t0 = time.perf_counter()
    for jobs in batches:
        gen.enqueue(jobs)
        while gen.num_remaining_jobs():
            gen.iterate()
    return time.perf_counter() - t0, gen.counters.prefill_tokens_total - before


def run_alternatives_bench(args: argparse.Namespace) -> int:
    n = args.alternatives
    if n < 2:
        raise ValueError("--alternatives needs at least 2 replies to compare with one")
    if args.model is not None:
        check_model_path(args.model)
    model = Model.load(args.model, weights=args.weights)
    tok = Tokenizer.load(args.model)
    p, g = args.prompt_tokens, args.new_tokens
    if p + g > model.config.max_seq_len:
        raise ValueError(f"--prompt-tokens + --new-tokens ({p + g}) exceeds the model's context ({model.config.max_seq_len})")
    vocab = min(model.vocab_size, tok.vocab_size)
    prompt = torch.randint(100, vocab, (1, p), generator=torch.Generator().manual_seed(0))
    pages = n * -(-(p + g) // PAGE) + 1
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=pages * PAGE, page_size=PAGE), tok)
    gen.warmup()
    log(f"pagedeck: {model.name} ({model.weight_format} weights), {torch.get_num_threads()} threads; "
        f"{n} replies of {g} tokens to a {p}-token prompt")

    def jobs(k: int, seed: int) -> list[DynamicJob]:
        return [DynamicJob(prompt, g, gen_settings=SAMPLED, seed=seed + i) for i in range(k)]

    runs: dict[str, list[tuple[float, int]]] = {"1 reply": [], f"{n} at once": [], f"{n} one after another": []}
    for r in range(args.repeats):
        log(f"-- repeat {r + 1}/{args.repeats}")
        runs["1 reply"].append(_timed(gen, [jobs(1, 0)]))
        runs[f"{n} at once"].append(_timed(gen, [jobs(n, 0)]))
        runs[f"{n} one after another"].append(_timed(gen, [jobs(1, i) for i in range(n)]))
    table = {name: (statistics.median(s for s, _ in xs), statistics.median(t for _, t in xs)) for name, xs in runs.items()}
    one = table["1 reply"][0]
    print(f"{n} replies to one {p}-token prompt, {g} tokens each ({model.name}, {model.weight_format} weights, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats}):")
    print("| run | time to the last reply (s) | x one reply | prompt tokens computed |")
    print("| --- | --- | --- | --- |")
    for name, (secs, prefill) in table.items():
        print(f"| {name} | {secs:.2f} | {secs / one:.2f} | {prefill} |")
    if args.json:
        print(json.dumps({"alternatives": n, "prompt_tokens": p, "new_tokens": g, "weights": model.weight_format,
                          "threads": torch.get_num_threads(),
                          "medians": {k: {"seconds": s, "prompt_tokens_computed": t} for k, (s, t) in table.items()},
                          "runs": runs}))
    return 0

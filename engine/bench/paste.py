"""`python -m engine bench --paste N`: do the other chats keep decoding while one chat prefills a long paste?

`--paste-others` chats decode (greedy, no stop); their decode rate is measured over a window, then an
N-token prompt is enqueued and their rate is measured again from that moment until the paste's first
token. Reported: both rates (tokens per second per chat), their ratio (the goal: >= 50 %) and the paste's
TTFT, with the step budget in time (engine.step_budget, the default) and with the old fixed token budget
(prefill_slowdown=None: every step may prefill max_chunk_size tokens). Medians of --repeats runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ..cache.paged_cache import PagedCache
from ..contract import SamplerSettings
from ..generator.generator import DynamicGenerator
from ..generator.job import DynamicJob
from ..model.model import Model
from ..model.tokenizer import Tokenizer

OTHER_PROMPT = 64
WINDOW_TOKENS = 24  # decode tokens per chat measured before the paste
PAGE = 256


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _ids(g: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(100, vocab, (n,), generator=g).tolist()


def run_once(model: Model, tok: Tokenizer, paste: int, others: int, slowdown: float | None, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    vocab = min(model.vocab_size, tok.vocab_size)
    new = max_new = min(2048, model.config.max_seq_len - OTHER_PROMPT)
    cache = PagedCache(model, max_tokens=(others * -(-(OTHER_PROMPT + new) // PAGE) + -(-(paste + 1) // PAGE) + 1) * PAGE,
                       page_size=PAGE)
    gen = DynamicGenerator(model, cache, tok, prefill_slowdown=slowdown)
    greedy = SamplerSettings.greedy()
    chats = [DynamicJob(torch.tensor([_ids(g, OTHER_PROMPT, vocab)]), max_new, gen_settings=greedy) for _ in range(others)]
    gen.enqueue(chats)
    counts = {j: 0 for j in chats}

    def step() -> tuple[float, list[dict]]:
        results = gen.iterate()
        now = time.perf_counter()
        for r in results:
            if r["stage"] == "streaming" and r["job"] in counts:
                counts[r["job"]] += len(r["token_ids"])
        return now, results

    while min(counts.values()) < 2:  # all prefilled and decoding
        step()
    t0, base = time.perf_counter(), dict(counts)
    while min(counts.values()) - min(base.values()) < WINDOW_TOKENS:
        now, _ = step()
    before = sum(counts[j] - base[j] for j in chats) / others / (now - t0)

    paste_job = DynamicJob(torch.tensor([_ids(g, paste, vocab)]), 1, gen_settings=greedy)
    t1, base = time.perf_counter(), dict(counts)
    gen.enqueue(paste_job)
    ttft = None
    while ttft is None:
        now, results = step()
        if any(r["job"] is paste_job and r["stage"] == "streaming" for r in results):
            ttft = now - t1
        if min(counts.values()) >= max_new:
            raise RuntimeError("the other chats finished before the paste was prefilled; raise their max_new_tokens")
    during = sum(counts[j] - base[j] for j in chats) / others / ttft
    gen.clear_queue()
    return {"decode_tok_s_before": before, "decode_tok_s_during": during, "ratio": during / before, "paste_ttft_s": ttft}


def run_paste_bench(args: argparse.Namespace) -> int:
    model = Model.load(args.model, weights=args.weights)
    tok = Tokenizer.load(args.model)
    if args.paste + 1 > model.config.max_seq_len:
        raise ValueError(f"--paste {args.paste} does not fit the model's context ({model.config.max_seq_len})")
    log(f"pagedeck: {model.name} ({model.weight_format} weights), {args.paste_others} chats decoding, "
        f"a {args.paste}-token paste")
    warm = DynamicGenerator(model, PagedCache(model, max_tokens=4 * PAGE, page_size=PAGE), tok)
    warm.warmup()
    modes = {"time budget (prefill_slowdown=1.6, the default)": 1.6, "token budget (old: 256 tokens a step)": None}
    runs = {name: [] for name in modes}
    for r in range(args.repeats):  # alternate the two budgets
        for name, slowdown in modes.items():
            log(f"-- repeat {r + 1}/{args.repeats}: {name}")
            runs[name].append(run_once(model, tok, args.paste, args.paste_others, slowdown, seed=r))
    table = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"{args.paste}-token paste while {args.paste_others} chats decode ({model.weight_format} weights, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats}):")
    print("| budget | others' decode tok/s before | during the paste | kept | paste TTFT (s) |")
    print("| --- | --- | --- | --- | --- |")
    for name, m in table.items():
        print(f"| {name} | {m['decode_tok_s_before']:.1f} | {m['decode_tok_s_during']:.1f} | {m['ratio']:.0%} | "
              f"{m['paste_ttft_s']:.1f} |")
    if args.json:
        print(json.dumps({"paste": args.paste, "others": args.paste_others, "weights": model.weight_format,
                          "threads": torch.get_num_threads(), "medians": table, "runs": runs}))
    return 0

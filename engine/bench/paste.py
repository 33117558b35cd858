"""`python -m engine bench --paste N`: do the other chats keep decoding while one chat prefills a long paste?

`--paste-others` chats decode (greedy, no stop); once they have settled, an N-token prompt is enqueued and
their decode rate is measured from that moment until the paste's first token. The baseline is a control
run: the same chats (same seed: the same prompts) from the same point, decoding the same number of tokens
with no paste. Their steps slow down as their contexts grow (attention reads every cached token, and they
decode hundreds of tokens during a paste), so a rate taken before the paste overstated what the paste costs
them. Reported: both rates (tokens per second per chat), their ratio (the goal: >= 50 %) and the paste's
TTFT, with the step budget in time (engine.step_budget, the default) and with the old fixed token budget
(prefill_slowdown=None: every step may prefill max_chunk_size tokens). Medians of --repeats runs.
"""
from __future__ import annotations

import argparse
import inspect
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
SETTLE_TOKENS = 8  # decode tokens per chat before the paste arrives
PAGE = 256


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _ids(g: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(100, vocab, (n,), generator=g).tolist()


class _Chats:
    """`others` chats decoding in one generator, with a count of the tokens each has streamed."""

    def __init__(self, model: Model, tok: Tokenizer, paste: int, others: int, slowdown: float | None, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.vocab = min(model.vocab_size, tok.vocab_size)
        self.max_new = min(2048, model.config.max_seq_len - OTHER_PROMPT)
        pages = others * -(-(OTHER_PROMPT + self.max_new) // PAGE) + -(-(paste + 1) // PAGE) + 1
        self.gen = DynamicGenerator(model, PagedCache(model, max_tokens=pages * PAGE, page_size=PAGE), tok,
                                    prefill_slowdown=slowdown)
        chats = [DynamicJob(torch.tensor([_ids(self.g, OTHER_PROMPT, self.vocab)]), self.max_new,
                            gen_settings=SamplerSettings.greedy()) for _ in range(others)]
        self.gen.enqueue(chats)
        self.counts = {j: 0 for j in chats}
        while min(self.counts.values()) < SETTLE_TOKENS:  # all prefilled and decoding
            self.step()

    def step(self) -> list[dict]:
        results = self.gen.iterate()
        for r in results:
            if r["stage"] == "streaming" and r["job"] in self.counts:
                self.counts[r["job"]] += len(r["token_ids"])
        if min(self.counts.values()) >= self.max_new:
            raise RuntimeError("the other chats finished before the paste was prefilled; raise their max_new_tokens")
        return results

    def decoded(self) -> int:
        return sum(self.counts.values())


def run_once(model: Model, tok: Tokenizer, paste: int, others: int, slowdown: float | None, seed: int) -> dict:
    chats = _Chats(model, tok, paste, others, slowdown, seed)
    paste_job = DynamicJob(torch.tensor([_ids(chats.g, paste, chats.vocab)]), 1, gen_settings=SamplerSettings.greedy())
    base, t0 = chats.decoded(), time.perf_counter()
    chats.gen.enqueue(paste_job)
    while not any(r["job"] is paste_job and r["stage"] == "streaming" for r in chats.step()):
        pass
    ttft, tokens = time.perf_counter() - t0, chats.decoded() - base
    chats.gen.clear_queue()

    control = _Chats(model, tok, paste, others, slowdown, seed)  # the same chats, the same stretch, no paste
    base, t0 = control.decoded(), time.perf_counter()
    while control.decoded() - base < tokens:
        control.step()
    control_s = time.perf_counter() - t0
    control.gen.clear_queue()
    without, during = (control.decoded() - base) / others / control_s, tokens / others / ttft
    return {"decode_tok_s_without": without, "decode_tok_s_during": during, "ratio": during / without,
            "paste_ttft_s": ttft}


def run_paste_bench(args: argparse.Namespace) -> int:
    model = Model.load(args.model, weights=args.weights)
    tok = Tokenizer.load(args.model)
    if args.paste + 1 > model.config.max_seq_len:
        raise ValueError(f"--paste {args.paste} does not fit the model's context ({model.config.max_seq_len})")
    log(f"pagedeck: {model.name} ({model.weight_format} weights), {args.paste_others} chats decoding, "
        f"a {args.paste}-token paste")
    warm = DynamicGenerator(model, PagedCache(model, max_tokens=4 * PAGE, page_size=PAGE), tok)
    warm.warmup()
    default = inspect.signature(DynamicGenerator).parameters["prefill_slowdown"].default
    modes = {f"time budget (prefill_slowdown={default}, the default)": default,
             "token budget (old: 256 tokens a step)": None}
    runs = {name: [] for name in modes}
    for r in range(args.repeats):  # alternate the two budgets
        for name, slowdown in modes.items():
            log(f"-- repeat {r + 1}/{args.repeats}: {name}")
            runs[name].append(run_once(model, tok, args.paste, args.paste_others, slowdown, seed=r))
    table = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"{args.paste}-token paste while {args.paste_others} chats decode ({model.weight_format} weights, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats}):")
    print("| budget | others' decode tok/s without the paste (control run) | during the paste | kept | paste TTFT (s) |")
    print("| --- | --- | --- | --- | --- |")
    for name, m in table.items():
        print(f"| {name} | {m['decode_tok_s_without']:.1f} | {m['decode_tok_s_during']:.1f} | {m['ratio']:.0%} | "
              f"{m['paste_ttft_s']:.1f} |")
    if args.json:
        print(json.dumps({"paste": args.paste, "others": args.paste_others, "weights": model.weight_format,
                          "threads": torch.get_num_threads(), "medians": table, "runs": runs}))
    return 0

"""`python -m engine bench --paste N`: do the other chats keep decoding while one chat prefills a long paste,
and does the paste still come back soon?

`--paste-others` chats decode (greedy, no stop); once they have settled, an N-token prompt is enqueued and
their decode rate is measured from that moment until the paste's first token. The baseline is a control
run: the same chats (same seed: the same prompts) from the same point, decoding the same number of tokens
with no paste. Their steps slow down as their contexts grow (attention reads every cached token), so a rate
taken before the paste overstated what the paste costs them. The paste's own baseline is the same prompt
prefilled alone (a fresh generator, nobody decoding). Reported, medians of --repeats runs: the others' rate
kept (goal >= 50 %), the paste's TTFT over its solo prefill (goal <= 2x), and what doesn't depend on how busy
the CPU was: the steps the paste took, its chunk sizes, and the step budget's measured costs (D, a decode
step; p, a prompt token alone; o, a mixed step's time beyond its chunk's solo cost) with the ratio they
predict (engine.generator.step_budget: kept = 1/r by design).
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
SETTLE_TOKENS = 8  # decode tokens per chat before the paste arrives
PAGE = 256


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _ids(g: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(100, vocab, (n,), generator=g).tolist()


class _Chats:
    """`others` chats decoding in one generator, with a count of the tokens each has streamed."""

    def __init__(self, model: Model, tok: Tokenizer, paste: int, others: int, share: float | None, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.vocab = min(model.vocab_size, tok.vocab_size)
        self.max_new = min(2048, model.config.max_seq_len - OTHER_PROMPT)
        pages = others * -(-(OTHER_PROMPT + self.max_new) // PAGE) + -(-(paste + 1) // PAGE) + 1
        self.gen = DynamicGenerator(model, PagedCache(model, max_tokens=pages * PAGE, page_size=PAGE), tok,
                                    prefill_share=share)
        chats = [DynamicJob(torch.tensor([_ids(self.g, OTHER_PROMPT, self.vocab)]), self.max_new,
                            gen_settings=SamplerSettings.greedy()) for _ in range(others)]
        self.gen.enqueue(chats)
        self.counts = {j: 0 for j in chats}
        self.chunks: list[int] = []  # prefill tokens of each step
        while min(self.counts.values()) < SETTLE_TOKENS:  # all prefilled and decoding
            self.step()

    def step(self) -> list[dict]:
        results = self.gen.iterate()
        self.chunks.append(self.gen.metrics()["prefill_tokens_step"])
        for r in results:
            if r["stage"] == "streaming" and r["job"] in self.counts:
                self.counts[r["job"]] += len(r["token_ids"])
        if min(self.counts.values()) >= self.max_new:
            raise RuntimeError("the other chats finished before the paste was prefilled; raise their max_new_tokens")
        return results

    def decoded(self) -> int:
        return sum(self.counts.values())


def solo_ttft(model: Model, tok: Tokenizer, paste: int, others: int, seed: int) -> tuple[float, int]:
    """The paste's prompt (the same ids as run_once's) prefilled alone: enqueue to first token, and the
    chunk size it prefilled in (a generator without a step budget: its max_chunk_size)."""
    g = torch.Generator().manual_seed(seed)
    vocab = min(model.vocab_size, tok.vocab_size)
    for _ in range(others):
        _ids(g, OTHER_PROMPT, vocab)
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=-(-(paste + 1) // PAGE) * PAGE, page_size=PAGE), tok)
    job = DynamicJob(torch.tensor([_ids(g, paste, vocab)]), 1, gen_settings=SamplerSettings.greedy())
    t0 = time.perf_counter()
    gen.enqueue(job)
    while not any(r["job"] is job and r["stage"] == "streaming" for r in gen.iterate()):
        pass
    return time.perf_counter() - t0, gen.max_chunk_size


def run_once(model: Model, tok: Tokenizer, paste: int, others: int, share: float | None, seed: int) -> dict:
    chats = _Chats(model, tok, paste, others, share, seed)
    paste_job = DynamicJob(torch.tensor([_ids(chats.g, paste, chats.vocab)]), 1, gen_settings=SamplerSettings.greedy())
    base, t0, first = chats.decoded(), time.perf_counter(), len(chats.chunks)
    chats.gen.enqueue(paste_job)
    while not any(r["job"] is paste_job and r["stage"] == "streaming" for r in chats.step()):
        pass
    ttft, tokens, chunks = time.perf_counter() - t0, chats.decoded() - base, chats.chunks[first:]
    budget = chats.gen.step_budget
    chats.gen.clear_queue()

    control = _Chats(model, tok, paste, others, share, seed)  # the same chats, the same stretch, no paste
    base, t0 = control.decoded(), time.perf_counter()
    while control.decoded() - base < tokens:
        control.step()
    control_s = time.perf_counter() - t0
    control.gen.clear_queue()
    solo, solo_chunk = solo_ttft(model, tok, paste, others, seed)
    without, during = (control.decoded() - base) / others / control_s, tokens / others / ttft
    spent = [c for c in chunks if c]
    out = {"decode_tok_s_without": without, "decode_tok_s_during": during, "ratio": during / without,
           "paste_ttft_s": ttft, "solo_ttft_s": solo, "ttft_ratio": ttft / solo, "steps": len(chunks),
           "prefill_steps": len(spent), "median_chunk": statistics.median(spent), "max_chunk": max(spent), "solo_chunk": solo_chunk}
    if budget is not None:  # the cost model the budget fitted and why it chose its chunks
        o = budget.overhead_s[budget.mode]
        out.update(budget.explain(), overhead_ms=1e3 * (o or 0), predicted_ratio=budget.predicted_ratio() or 0.0)
    return out


def _median(runs: list[dict], key: str):
    values = [r[key] for r in runs]
    return statistics.median(values) if isinstance(values[0], (int, float)) else max(set(values), key=values.count)


def weight_passes(model: Model) -> int:
    """Passes over the weights a mixed step makes: 2 where prompt rows take a dense fp32 copy and decode rows
    the packed kernels (engine.model.qlinear RowSplit), else 1 (every row in one GEMM). With one pass the
    decoders' rows ride in the chunk's step nearly free; with two, the step budget's A exceeds D."""
    return 2 if model.weight_format != "dense" and getattr(model, "prompt_dense", False) else 1


def run_paste_bench(args: argparse.Namespace) -> int:
    model = Model.load(args.model, weights=args.weights)
    tok = Tokenizer.load(args.model)
    if args.paste + 1 > model.config.max_seq_len:
        raise ValueError(f"--paste {args.paste} does not fit the model's context ({model.config.max_seq_len})")
    log(f"pagedeck: {model.name} ({model.weight_format} weights), {args.paste_others} chats decoding, "
        f"a {args.paste}-token paste")
    warm = DynamicGenerator(model, PagedCache(model, max_tokens=4 * PAGE, page_size=PAGE), tok)
    warm.warmup()
    runs = []
    for r in range(args.repeats):
        log(f"-- repeat {r + 1}/{args.repeats}")
        runs.append(run_once(model, tok, args.paste, args.paste_others, 1.0, seed=r))
        log(json.dumps(runs[-1]))
    m = {k: _median(runs, k) for k in runs[0]}
    print(f"{args.paste}-token paste while {args.paste_others} chats decode ({model.name}, {model.weight_format} "
          f"weights, {torch.get_num_threads()} threads, medians of {args.repeats}):")
    print("| others' tok/s without / during the paste | kept | paste TTFT / alone (s) | TTFT ratio | steps "
          "(with prefill) | chunk median / max | budget: mode, D / p / o (ms), predicted r |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {m['decode_tok_s_without']:.1f} / {m['decode_tok_s_during']:.1f} | {m['ratio']:.0%} | "
          f"{m['paste_ttft_s']:.1f} / {m['solo_ttft_s']:.1f} | {m['ttft_ratio']:.2f}x | {m['steps']} "
          f"({m['prefill_steps']}) | {m['median_chunk']} / {m['max_chunk']} | {m.get('mode')}, "
          f"{m.get('decode_ms', 0):.1f} / {m.get('token_ms', 0):.2f} / {m.get('overhead_ms', 0):.1f}, "
          f"{m.get('predicted_ratio', 0):.2f} |")
    print(f"mixed steps: {weight_passes(model)} pass(es) over the weights; the solo prefill (the TTFT reference) "
          f"ran in chunks of {m['solo_chunk']} tokens")
    if m.get("line_b_ms"):
        print(f"mixed step fitted as A + B*c = {m['line_a_ms']:.1f} ms + {m['line_b_ms']:.3f} ms/token "
              f"(A = {m['a_over_d']:.2f} D, B = {m['b_over_p']:.2f} p; both goals reachable iff p A <= D (p + k (p - B)) for some k: "
              f"{'yes' if m['reachable'] else 'no'}); chunk target {m['chunk_target']} tokens, saved for "
              f"{m['steps_fitted'] or 1} decode step(s); predicted kept {m['predicted_kept']:.0%}, r "
              f"{m['predicted_r']:.2f}")
        print(f"why: {m['why']}")
    if args.json:
        print(json.dumps({"paste": args.paste, "others": args.paste_others, "weights": model.weight_format,
                          "threads": torch.get_num_threads(), "medians": m, "runs": runs}))
    return 0

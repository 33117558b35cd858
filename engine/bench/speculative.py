"""Where speculative decoding stops paying: aggregate tok/s with and without drafting, by batch size.

The default model has no smaller sibling on disk, so the drafter here is n-gram lookup over a prompt that
asks the model to repeat a passage (drafts are often right), which is the case speculation is for.
`python -m engine bench-spec [--model PATH] [--batches 1,2,4,8] [--new-tokens 48] [--draft-tokens 4] [--json]`
"""
from __future__ import annotations

import argparse
import json
import time

from ..cache.paged_cache import PagedCache
from ..contract import DEFAULT_PAGE_SIZE, WEIGHT_NAMES, SamplerSettings
from ..generator.generator import DynamicGenerator
from ..generator.job import DynamicJob
from ..model.model import Model
from ..model.tokenizer import Tokenizer

PASSAGE = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
           "All that glitters is not gold. Actions speak louder than words. ")


def _run(model: Model, tok: Tokenizer, batch: int, new_tokens: int, ngram: bool, draft_tokens: int) -> dict:
    cache = PagedCache(model, max_tokens=max(4096, batch * 512), page_size=DEFAULT_PAGE_SIZE)
    gen = DynamicGenerator(model, cache, tok, use_ngram_draft=ngram, num_draft_tokens=draft_tokens,
                           max_draft_batch_size=10**6)
    jobs = []
    for i in range(batch):
        text = tok.apply_chat_template([{"role": "user", "content": f"Repeat this text exactly, twice ({i}):\n{PASSAGE}"}])
        jobs.append(DynamicJob(tok.encode(text, encode_special_tokens=True), new_tokens, min_new_tokens=new_tokens,
                               gen_settings=SamplerSettings.greedy(), stop_conditions=list(tok.stop_token_ids)))
    gen.enqueue(jobs)
    decode_start = None
    tokens = 0
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                if decode_start is None:
                    decode_start = time.perf_counter()
                else:
                    tokens += len(r["token_ids"])
    elapsed = time.perf_counter() - decode_start
    m = gen.metrics()
    drafted = m["drafted_tokens_total"]
    return {"tok_s": tokens / elapsed, "acceptance": m["accepted_tokens_total"] / drafted if drafted else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine bench-spec", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--weights", choices=WEIGHT_NAMES, default="dense")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    model, tok = Model.load(args.model, weights=args.weights), Tokenizer.load(args.model)
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        plain = _run(model, tok, b, args.new_tokens, False, args.draft_tokens)
        spec = _run(model, tok, b, args.new_tokens, True, args.draft_tokens)
        rows.append({"batch": b, "plain_tok_s": plain["tok_s"], "ngram_tok_s": spec["tok_s"],
                     "speedup": spec["tok_s"] / plain["tok_s"], "acceptance": spec["acceptance"]})
        if not args.json:
            acc = "n/a" if spec["acceptance"] is None else f"{spec['acceptance']:.0%}"
            print(f"batch {b:3d}: plain {plain['tok_s']:7.1f} tok/s  n-gram {spec['tok_s']:7.1f} tok/s  "
                  f"x{rows[-1]['speedup']:.2f}  acceptance {acc}", flush=True)
    crossover = next((r["batch"] for r in rows if r["speedup"] < 1.0), None)
    if args.json:
        print(json.dumps({"rows": rows, "first_batch_without_gain": crossover}))
    else:
        print(f"first batch size where drafting no longer pays: {crossover if crossover else 'none measured'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

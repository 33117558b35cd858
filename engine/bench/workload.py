"""Workload: the token ids every side of `python -m engine bench` runs (pagedeck, transformers, llama.cpp),
so each side sees exactly the same prompts.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch


@dataclass
class Workload:
    """The token ids every side runs, so engine and peer see exactly the same prompts."""

    single: list[int]
    streams: list[list[int]]
    ttft_first: list[int]  # shared prefix + tail A
    ttft_second: list[int]  # shared prefix + tail B
    new_tokens: int
    shared_prefix: int


def make_workload(args: argparse.Namespace, vocab: int, special: set[int], max_len: int) -> Workload:
    """Seeded random token ids (specials excluded); stream prompts vary in length so the peer must pad."""
    longest = max(args.prompt_tokens, args.shared_prefix + args.tail_tokens) + args.new_tokens
    if longest > max_len:
        raise ValueError(f"the benchmark needs sequences of {longest} tokens but the model's context is {max_len}")
    g = torch.Generator().manual_seed(1234)
    allowed = torch.tensor([i for i in range(vocab) if i not in special])

    def ids(n: int) -> list[int]:
        return allowed[torch.randint(len(allowed), (n,), generator=g)].tolist()

    n, p = args.streams, args.prompt_tokens
    lengths = [max(1, p - (i * p) // (2 * n)) for i in range(n)]  # p down to ~p/2
    prefix = ids(args.shared_prefix)
    return Workload(single=ids(p), streams=[ids(k) for k in lengths], ttft_first=prefix + ids(args.tail_tokens),
                    ttft_second=prefix + ids(args.tail_tokens), new_tokens=args.new_tokens,
                    shared_prefix=args.shared_prefix)

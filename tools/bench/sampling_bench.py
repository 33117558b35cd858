"""Per-call cost of JobSampler.sample on one logits row: `python -m tools.bench.sampling_bench`.

Measures the sampler alone (no model) so its share of a decode step is known; the vocabulary defaults to
the default model's (49152, padded to 49152).
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.contract import SamplerSettings
from engine.sampling.pool import SamplingPool
from engine.sampling.sampler import JobSampler

CASES: dict[str, SamplerSettings] = {
    "greedy": SamplerSettings.greedy(),
    "temp+top_k+top_p (no penalties)": SamplerSettings(token_repetition_penalty=1.0),
    "defaults (rep penalty 1.025 whole ctx)": SamplerSettings(),
    "temp only (top_k 0, top_p 1)": SamplerSettings(top_k=0, top_p=1.0, token_repetition_penalty=1.0),
    "top_p 0.9 without top_k": SamplerSettings(top_k=0, top_p=0.9, token_repetition_penalty=1.0),
    "min_p 0.05 without top_k": SamplerSettings(top_k=0, top_p=1.0, min_p=0.05, token_repetition_penalty=1.0),
    "DRY + freq/presence": SamplerSettings(dry_multiplier=0.8, token_frequency_penalty=0.1,
                                           token_presence_penalty=0.1, dry_sequence_breakers=[0]),
    "XTC + mirostat + skew": SamplerSettings(xtc_probability=0.5, mirostat=True, skew=0.5),
}


def time_case(settings: SamplerSettings, vocab: int, ctx_len: int, iters: int) -> float:
    """Median microseconds per sample() over `iters` calls with realistic (peaked) logits."""
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randn(vocab, generator=gen) * 4.0 for _ in range(8)]
    ctx = torch.randint(0, vocab, (ctx_len,), generator=gen).tolist()
    js = JobSampler(settings, seed=0, vocab_size=vocab)
    for r in rows:
        js.sample(r, ctx)
    times = []
    for i in range(iters):
        t0 = time.perf_counter()
        js.sample(rows[i % len(rows)], ctx)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


def time_pool(jobs: int, vocab: int, iters: int) -> tuple[float, float, int]:
    """Microseconds per step for `jobs` samplers inline vs. on the pool, and busy workers."""
    settings = SamplerSettings(token_repetition_penalty=1.0)
    samplers = [JobSampler(settings, seed=i, vocab_size=vocab) for i in range(jobs)]
    rows = torch.randn(jobs, vocab) * 4.0
    fns = [lambda js=js, r=rows[i]: js.sample(r, ()) for i, js in enumerate(samplers)]
    out = []
    for pool in (SamplingPool(max_threads=1), SamplingPool()):
        pool.run(fns)
        t0 = time.perf_counter()
        for _ in range(iters):
            pool.run(fns)
        out.append((time.perf_counter() - t0) / iters * 1e6)
        busy = pool.busy_last
        pool.shutdown()
    return out[0], out[1], busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--ctx", type=int, default=2048, help="context length fed to penalties/DRY")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=8)
    a = ap.parse_args()
    print(f"vocab {a.vocab}, context {a.ctx} tokens, median of {a.iters} calls, torch threads "
          f"{torch.get_num_threads()}")
    for name, s in CASES.items():
        print(f"  {name:42s} {time_case(s, a.vocab, a.ctx, a.iters):8.1f} us/call")
    inline, pooled, busy = time_pool(a.jobs, a.vocab, max(a.iters // 4, 10))
    print(f"  {a.jobs} jobs/step: inline {inline:.0f} us, pool {pooled:.0f} us ({busy} workers busy)")


if __name__ == "__main__":
    main()

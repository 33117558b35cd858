"""`python -m engine bench`: what users feel (decode speed, concurrency, prefix-cache TTFT), measured in one
run on one machine, optionally beside transformers (engine.bench.peer) on the same model and prompts.

Definitions (the same for both sides):
- batch-1 decode tok/s: one request, greedy; tokens after the first over the time after the first
  (prefill excluded), after a warm-up.
- N-stream tok/s: N requests of different prompt lengths started together; all generated tokens over the
  wall time from start to the last token (prefill included: it is part of serving N users).
- TTFT: request start to first token. "cached": a second request that shares the first one's prefix and
  differs in the tail (the peer has no prefix cache, so it recomputes the whole prompt). Median of 3.
- decode roofline: weight bytes read per decode step / copy bandwidth measured here and now.
Progress goes to stderr; the table and the JSON line go to stdout.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from ..cache.paged_cache import PagedCache
from ..contract import DEFAULT_PAGE_SIZE as PAGE_SIZE
from ..contract import SamplerSettings, check_model_path
from ..generator.generator import DynamicGenerator
from ..generator.job import DynamicJob
from ..model.model import Model
from ..model.tokenizer import Tokenizer
from .measure import copy_bandwidth

TTFT_REPEATS = 3


@dataclass
class Workload:
    """The token ids every side runs, so engine and peer see exactly the same prompts."""

    single: list[int]
    streams: list[list[int]]
    ttft_first: list[int]  # shared prefix + tail A
    ttft_second: list[int]  # shared prefix + tail B
    new_tokens: int
    shared_prefix: int


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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


def decode_weight_bytes(model: Model, dense: bool = False) -> int:
    """Bytes of weights one decode step reads: all of them, except an untied embedding (one row read).

    dense=True: as if every weight were in the model dtype (what a dequantizing peer reads)."""
    if not dense:
        return model.decode_bytes()
    params = model.num_parameters() - (0 if model.lm_head is model.embed else model.embed.numel())
    return params * torch.empty(0, dtype=model.dtype).element_size()


# ---- the engine side ----------------------------------------------------------------------------
@dataclass
class Run:
    """Timings of one set of jobs driven to completion through iterate()."""

    t_start: float
    first: dict = field(default_factory=dict)  # job -> time of its first token
    end: dict = field(default_factory=dict)  # job -> time of its last token
    final: dict = field(default_factory=dict)  # job -> eos result
    overhead_s: list[float] = field(default_factory=list)  # per decode-only step: host time outside forward
    step_s: list[float] = field(default_factory=list)  # per decode-only step: whole iterate()


def drive(gen: DynamicGenerator, jobs: list[DynamicJob]) -> Run:
    m = gen.metrics()
    steps, total = m["steps_total"], m["time_total_s"]
    run = Run(t_start=time.perf_counter())
    gen.enqueue(jobs)
    while gen.num_remaining_jobs():
        results = gen.iterate()
        now = time.perf_counter()
        for r in results:
            if r["stage"] != "streaming":
                continue
            run.first.setdefault(r["job"], now)
            if r["eos"]:
                run.end[r["job"]] = now
                run.final[r["job"]] = r
        m = gen.metrics()
        if m["steps_total"] > steps:
            if m["prefill_tokens_step"] == 0:
                run.overhead_s.append(m["step_host_overhead_s"])
                run.step_s.append(m["time_total_s"] - total)
            steps, total = m["steps_total"], m["time_total_s"]
    return run


def bench_engine(model: Model, tokenizer: Tokenizer, w: Workload) -> dict:
    greedy = SamplerSettings.greedy()

    def job(ids: list[int], n: int) -> DynamicJob:
        # no stop conditions: every request generates exactly n tokens on both sides
        return DynamicJob(torch.tensor([ids]), n, gen_settings=greedy)

    def pages(ids: list[int], n: int) -> int:
        return -(-(len(ids) + n) // PAGE_SIZE)

    need = max(sum(pages(s, w.new_tokens) for s in w.streams), pages(w.single, w.new_tokens),
               pages(w.ttft_first, 1) + pages(w.ttft_second, 1))
    cache = PagedCache(model, max_tokens=(need + 1) * PAGE_SIZE, page_size=PAGE_SIZE)
    gen = DynamicGenerator(model, cache, tokenizer)
    log("pagedeck: warm-up")
    gen.warmup()
    drive(gen, [job(w.ttft_first[: min(len(w.ttft_first), gen.max_chunk_size)], 2)])  # the largest prefill shape
    gen.reset_page_table()

    log(f"pagedeck: batch-1 decode ({len(w.single)}-token prompt, {w.new_tokens} new tokens)")
    one = job(w.single, w.new_tokens)
    run = drive(gen, [one])
    b1_tok_s = (w.new_tokens - 1) / (run.end[one] - run.first[one]) if w.new_tokens > 1 else 0.0
    b1_overhead, b1_step = _mean(run.overhead_s), _mean(run.step_s)

    log(f"pagedeck: {len(w.streams)} concurrent streams")
    gen.reset_page_table()
    jobs = [job(s, w.new_tokens) for s in w.streams]
    run = drive(gen, jobs)
    streams_tok_s = len(jobs) * w.new_tokens / (max(run.end.values()) - run.t_start)
    st_overhead, st_step = _mean(run.overhead_s), _mean(run.step_s)

    log(f"pagedeck: TTFT with and without a cached {w.shared_prefix}-token prefix")
    uncached, cached, hit = [], [], 0
    for _ in range(TTFT_REPEATS):
        gen.reset_page_table()
        for ids, into in ((w.ttft_first, uncached), (w.ttft_second, cached)):
            j = job(ids, 1)
            run = drive(gen, [j])
            into.append(run.first[j] - run.t_start)
            hit = run.final[j]["cached_tokens"]
    gen.reset_page_table()
    return {
        "batch1_tok_s": b1_tok_s,
        "streams_tok_s": streams_tok_s,
        "ttft_uncached_ms": statistics.median(uncached) * 1000,
        "ttft_cached_ms": statistics.median(cached) * 1000,
        "ttft_cached_fraction": statistics.median(cached) / statistics.median(uncached),
        "ttft_cached_tokens": hit,
        "step_host_overhead_ms": b1_overhead * 1000,
        "step_host_overhead_pct": 100 * b1_overhead / b1_step if b1_step else 0.0,
        "step_ms": b1_step * 1000,
        "streams_step_host_overhead_ms": st_overhead * 1000,
        "streams_step_host_overhead_pct": 100 * st_overhead / st_step if st_step else 0.0,
        "streams_step_ms": st_step * 1000,
    }


def _process_memory() -> dict:
    """This process's memory after loading: resident (anonymous = what the OS cannot page back to the
    file), and the peak so far (ru_maxrss), Linux figures."""
    import resource

    out = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[{"VmRSS": "rss_bytes", "RssAnon": "rss_anon_bytes", "RssFile": "rss_file_bytes"}[key]] = (
                        int(value.split()[0]) * 1024)
    except OSError:
        pass
    return out


def _model_files(path) -> list:
    from pathlib import Path

    path = Path(path)
    return sorted(path.glob("*.safetensors")) if path.is_dir() else [path]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


# ---- the command --------------------------------------------------------------------------------
def run_bench(args: argparse.Namespace) -> int:
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return _bench(args)
    finally:
        torch.set_num_threads(threads)  # the setting is process-wide; leave callers as they were


def _bench(args: argparse.Namespace) -> int:
    from .synthetic import SYNTHETIC_MODELS, synthetic_model

    t = time.perf_counter()
    if args.model in SYNTHETIC_MODELS:
        model = synthetic_model(args.model)
        tokenizer = Tokenizer.load(None)  # random weights: any tokenizer of a smaller vocabulary will do
    else:
        if args.model is not None:
            check_model_path(args.model)
        model = Model.load(args.model, weights=args.weights)
        tokenizer = Tokenizer.load(args.model)
    load_s = time.perf_counter() - t
    memory = _process_memory()
    log(f"pagedeck: loaded {model.name} on {model.device} ({model.dtype}, {model.weight_format} weights) "
        f"in {load_s:.2f} s")
    vocab = min(model.vocab_size, tokenizer.vocab_size)
    w = make_workload(args, vocab, tokenizer.special_token_ids | tokenizer.stop_token_ids, model.config.max_seq_len)

    log("measuring copy bandwidth")
    bandwidth = copy_bandwidth(model.device)
    weight_bytes = decode_weight_bytes(model)
    roofline = bandwidth / weight_bytes
    dense_roofline = bandwidth / decode_weight_bytes(model, dense=True)
    engine = {"load_s": load_s, **bench_engine(model, tokenizer, w)}
    engine["roofline_pct"] = 100 * engine["batch1_tok_s"] / roofline
    setup = {
        "model": model.name, "device": str(model.device), "dtype": str(model.dtype).replace("torch.", ""),
        "weights": model.weight_format,
        "torch_threads": torch.get_num_threads(), "streams": args.streams, "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens, "shared_prefix": args.shared_prefix, "tail_tokens": args.tail_tokens,
        "page_size": PAGE_SIZE, "copy_bandwidth_gb_s": bandwidth / 1e9, "decode_weight_bytes": weight_bytes,
        "roofline_tok_s": roofline, "dense_roofline_tok_s": dense_roofline,
        "weights_bytes": model.memory_bytes(), **memory,
        "file_bytes": sum(f.stat().st_size for f in _model_files(model.path)) if model.path else 0,
    }
    device, dtype, synthetic = model.device, model.dtype, args.model in SYNTHETIC_MODELS
    del model
    gc.collect()

    peer, ratio = {}, {}
    if args.peer == "transformers":
        from .peer import bench_transformers

        peer = bench_transformers(args.model, w, device, dtype, synthetic=synthetic, log=log)
        peer["roofline_pct"] = 100 * peer["batch1_tok_s"] / dense_roofline  # the peer reads dense weights
        ratio = {
            "batch1": engine["batch1_tok_s"] / peer["batch1_tok_s"],
            "streams": engine["streams_tok_s"] / peer["streams_tok_s"],
            "ttft_cached_speedup": peer["ttft_cached_ms"] / engine["ttft_cached_ms"],
        }
    print(format_table(setup, engine, peer, ratio))
    if args.json:
        print(json.dumps({"engine": engine, "peer": peer, "ratio": ratio, "setup": setup}))
    return 0


ROWS = [  # (key, label, format)
    ("load_s", "load time (s)", "{:.2f}"),
    ("batch1_tok_s", "batch-1 decode (tok/s)", "{:.1f}"),
    ("roofline_pct", "  % of decode roofline", "{:.0f}%"),
    ("streams_tok_s", "N-stream aggregate (tok/s)", "{:.1f}"),
    ("ttft_uncached_ms", "TTFT uncached (ms)", "{:.0f}"),
    ("ttft_cached_ms", "TTFT cached prefix (ms)", "{:.0f}"),
    ("ttft_cached_fraction", "  cached / uncached", "{:.1%}"),
    ("step_ms", "batch-1 step (ms)", "{:.2f}"),
    ("step_host_overhead_ms", "  host overhead (ms)", "{:.2f}"),
    ("step_host_overhead_pct", "  host overhead (% of step)", "{:.1f}%"),
    ("streams_step_ms", "N-stream decode step (ms)", "{:.2f}"),
    ("streams_step_host_overhead_ms", "  host overhead (ms)", "{:.2f}"),
    ("streams_step_host_overhead_pct", "  host overhead (% of step)", "{:.1f}%"),
]


def format_table(setup: dict, engine: dict, peer: dict, ratio: dict) -> str:
    lines = [
        f"model {setup['model']} on {setup['device']} ({setup['dtype']}, {setup['weights']} weights, "
        f"{setup['torch_threads']} threads); "
        f"{setup['streams']} streams, prompts {setup['prompt_tokens']}, new {setup['new_tokens']}, "
        f"shared prefix {setup['shared_prefix']} + tail {setup['tail_tokens']}",
        f"copy bandwidth {setup['copy_bandwidth_gb_s']:.1f} GB/s, decode weights "
        f"{setup['decode_weight_bytes'] / 1e6:.0f} MB -> roofline {setup['roofline_tok_s']:.1f} tok/s"
        + (f" (dense weights: {setup['dense_roofline_tok_s']:.1f} tok/s)" if setup["weights"] != "dense" else ""),
        f"memory after load: weights {setup['weights_bytes'] / 1e6:.0f} MB, RSS {setup.get('rss_bytes', 0) / 1e6:.0f} MB "
        f"(anonymous {setup.get('rss_anon_bytes', 0) / 1e6:.0f} MB), peak {setup['peak_rss_bytes'] / 1e6:.0f} MB; "
        f"file {setup['file_bytes'] / 1e6:.0f} MB",
        "",
        f"{'':32s}{'pagedeck':>12s}" + (f"{'transformers':>14s}" if peer else ""),
    ]
    for key, label, fmt in ROWS:
        row = f"{label:32s}{fmt.format(engine[key]):>12s}"
        if peer:
            row += f"{fmt.format(peer[key]) if key in peer else '-':>14s}"
        lines.append(row)
    if ratio:
        lines += ["", f"pagedeck / transformers: batch-1 {ratio['batch1']:.2f}x, {setup['streams']} streams "
                      f"{ratio['streams']:.2f}x, cached-prefix TTFT {ratio['ttft_cached_speedup']:.1f}x faster"]
        if peer.get("note"):
            lines.append(f"note: {peer['note']}")
    return "\n".join(lines)

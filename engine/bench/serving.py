"""`python -m engine bench`: what users feel (decode speed, concurrency, prefix-cache TTFT), measured in one
run on one machine, optionally beside a peer on the same model and token ids: transformers
(engine.bench.peer) or llama.cpp (engine.bench.llamacpp).

Definitions (the same for every side):
- batch-1 decode tok/s: one request, greedy; tokens after the first over the time after the first
  (prefill excluded), after a warm-up.
- N-stream tok/s: N requests of different prompt lengths started together; all generated tokens over the
  wall time from start to the last token (prefill included: it is part of serving N users).
- N-stream decode tok/s: N / the mean time of a step in which all N streams decode (no prefill in it).
- prefill tok/s: the uncached TTFT prompt's tokens / its TTFT.
- TTFT: request start to first token. "cached": a second request that shares the first one's prefix and
  differs in the tail (transformers has no prefix cache and recomputes the whole prompt). Median of 3.
- decode roofline: weight bytes read per decode step / read bandwidth, the median of readings taken before each
  round and after the last.
The engine and the peer run alternately, --repeats times each; every figure is the median of the repeats.
Progress goes to stderr; the table and the JSON line go to stdout.
"""
from __future__ import annotations

import argparse
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
from ..model.model_and_tokenizer import load_model_and_tokenizer
from ..model.tokenizer import Tokenizer
from .measure import read_bandwidth, read_through
from .workload import Workload, make_workload

TTFT_REPEATS = 3


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def decode_weight_bytes(model: Model, dense: bool = False) -> int:
    """Bytes of weights one decode step reads: all of them, except an untied embedding (one row read).

    dense=True: as if every weight were in the model dtype (what a dequantizing peer reads)."""
    if not dense:
        return model.decode_bytes()
    params = model.num_parameters() - (0 if model.head_is_embedding() else model.embed.numel())
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
    step_rows: list[int] = field(default_factory=list)  # per decode-only step: sequences decoding

    def full_steps(self, n: int) -> list[float]:
        """Times of the decode-only steps in which all n streams decoded."""
        return [s for s, r in zip(self.step_s, self.step_rows) if r == n]


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
                run.step_rows.append(m["decode_tokens_step"])
            steps, total = m["steps_total"], m["time_total_s"]
    return run


class EngineBench:
    """pagedeck's side: one generator, warmed up once; run() is one measurement set."""

    name = "pagedeck"

    def __init__(self, model: Model, tokenizer: Tokenizer, w: Workload):
        def pages(ids: list[int], n: int) -> int:
            return -(-(len(ids) + n) // PAGE_SIZE)

        need = max(sum(pages(s, w.new_tokens) for s in w.streams), pages(w.single, w.new_tokens),
                   pages(w.ttft_first, 1) + pages(w.ttft_second, 1))
        # admission keeps a page of growth room per running sequence (engine.generator.preemption): without
        # those, an exactly-sized cache admits only some streams at first and the rest wait for them to finish
        room = len(w.streams)
        cache = PagedCache(model, max_tokens=(need + room + 1) * PAGE_SIZE, page_size=PAGE_SIZE)
        self.gen = gen = DynamicGenerator(model, cache, tokenizer)
        self.w = w
        log("pagedeck: warm-up")
        gen.warmup()
        drive(gen, [self.job(w.ttft_first[: min(len(w.ttft_first), gen.max_chunk_size)], 2)])  # largest prefill
        gen.reset_page_table()

    def job(self, ids: list[int], n: int) -> DynamicJob:
        # no stop conditions: every request generates exactly n tokens on every side
        return DynamicJob(torch.tensor([ids]), n, gen_settings=SamplerSettings.greedy())

    def run(self) -> dict:
        gen, w, job = self.gen, self.w, self.job
        log(f"pagedeck: batch-1 decode ({len(w.single)}-token prompt, {w.new_tokens} new tokens)")
        gen.reset_page_table()
        one = job(w.single, w.new_tokens)
        run = drive(gen, [one])
        b1_tok_s = (w.new_tokens - 1) / (run.end[one] - run.first[one]) if w.new_tokens > 1 else 0.0
        b1_overhead, b1_step = _mean(run.overhead_s), _mean(run.step_s)

        log(f"pagedeck: {len(w.streams)} concurrent streams")
        gen.reset_page_table()
        jobs = [job(s, w.new_tokens) for s in w.streams]
        run = drive(gen, jobs)
        streams_tok_s = len(jobs) * w.new_tokens / (max(run.end.values()) - run.t_start)
        st_overhead, st_step = _mean(run.overhead_s), _mean(run.full_steps(len(jobs)))

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
            "streams_decode_tok_s": len(jobs) / st_step if st_step else 0.0,
            "prefill_tok_s": len(w.ttft_first) / statistics.median(uncached),
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

    def close(self) -> None:
        del self.gen


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
        if getattr(args, "alternatives", None):
            from .alternatives import run_alternatives_bench

            return run_alternatives_bench(args)
        if getattr(args, "paste", None):
            from .paste import run_paste_bench

            return run_paste_bench(args)
        return _bench(args)
    finally:
        torch.set_num_threads(threads)  # the setting is process-wide; leave callers as they were


def _bench(args: argparse.Namespace) -> int:
    from .synthetic import SYNTHETIC_MODELS, placeholder_tokenizer, synthetic_model

    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if args.model not in SYNTHETIC_MODELS:  # both engines time a load from the page cache, not the disk
        from ..model.loader import default_model_path

        if args.model is not None:
            check_model_path(args.model)
        files = _model_files(args.model if args.model is not None else default_model_path())
        log(f"read {read_through(files) / 1e6:.0f} MB of model files into the page cache before timing loads")
    t = time.perf_counter()
    if args.model in SYNTHETIC_MODELS:
        model = synthetic_model(args.model)
        tokenizer = placeholder_tokenizer(model.vocab_size)
    else:
        model, tokenizer = load_model_and_tokenizer(args.model, weights=args.weights)
    load_s = time.perf_counter() - t
    log(f"pagedeck: loaded {model.name} on {model.device} ({model.dtype}, {model.weight_format} weights) "
        f"in {load_s:.2f} s")
    if getattr(model, "settle_thread", None) is not None:  # its background work would slow what follows
        t = time.perf_counter()
        model.settle_thread.join()
        log(f"pagedeck: weights settled in the background (kernel layouts, 2 MB pages) in "
            f"{time.perf_counter() - t:.2f} s more")
    memory = _process_memory()  # settled: a model started on its mapped file holds its weights only now
    vocab = min(model.vocab_size, tokenizer.vocab_size)
    w = make_workload(args, vocab, tokenizer.special_token_ids | tokenizer.stop_token_ids, model.config.max_seq_len)

    weight_bytes = decode_weight_bytes(model)
    setup = {
        "model": model.name, "device": str(model.device), "dtype": str(model.dtype).replace("torch.", ""),
        "weights": model.weight_format, "peer": args.peer, "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(), "streams": args.streams, "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens, "shared_prefix": args.shared_prefix, "tail_tokens": args.tail_tokens,
        "page_size": PAGE_SIZE, "decode_weight_bytes": weight_bytes,
        "weights_bytes": model.memory_bytes(), **memory,
        "file_bytes": sum(f.stat().st_size for f in _model_files(model.path)) if model.path else 0,
        "date": time.strftime("%Y-%m-%d"),
    }
    sides = [EngineBench(model, tokenizer, w)]
    if args.peer == "transformers":
        from .peer import TransformersPeer

        sides.append(TransformersPeer(args.model, w, model.device, model.dtype,
                                      synthetic=args.model in SYNTHETIC_MODELS, log=log))
    elif args.peer == "llama.cpp":
        from .llamacpp import LlamaCppPeer

        sides.append(LlamaCppPeer(args.model, w, torch.get_num_threads(), log=log))
    runs: list[list[dict]] = [[] for _ in sides]
    # The VM's memory bandwidth drifts over minutes (42-82 GB/s in one hour here), so it is read before each
    # round and after the last, and the roofline divides by the median of those readings.
    log("measuring read bandwidth")
    readings = [read_bandwidth(model.device)]
    try:
        for r in range(args.repeats):  # alternate, so drift on a shared machine hits every side alike
            for side, into in zip(sides, runs):
                log(f"-- repeat {r + 1}/{args.repeats}: {side.name}")
                into.append(side.run())
            readings.append(read_bandwidth(model.device))
    finally:
        for side in sides[1:]:
            side.close()
    bandwidth = statistics.median(readings)
    roofline = bandwidth / weight_bytes
    setup.update({"read_bandwidth_gb_s": bandwidth / 1e9,
                  "read_bandwidth_readings_gb_s": [round(b / 1e9, 1) for b in readings],
                  "roofline_tok_s": roofline,
                  "dense_roofline_tok_s": bandwidth / decode_weight_bytes(model, dense=True)})
    engine = {"load_s": load_s, **medians(runs[0])}
    engine["roofline_pct"] = 100 * engine["batch1_tok_s"] / roofline
    peer, ratio = {}, {}
    if len(sides) > 1:
        peer = {"load_s": sides[1].load_s, **medians(runs[1]), "note": sides[1].note}
        # transformers reads dense weights; llama.cpp reads the GGUF's own blocks (as pagedeck packed does)
        peer_bytes = weight_bytes if args.peer == "llama.cpp" else decode_weight_bytes(model, dense=True)
        peer["roofline_pct"] = 100 * peer["batch1_tok_s"] * peer_bytes / bandwidth
        ratio = {"batch1": engine["batch1_tok_s"] / peer["batch1_tok_s"],
                 "streams": engine["streams_tok_s"] / peer["streams_tok_s"],
                 "prefill": engine["prefill_tok_s"] / peer["prefill_tok_s"],
                 "ttft_cached_speedup": peer["ttft_cached_ms"] / engine["ttft_cached_ms"]}
        if peer.get("streams_decode_tok_s"):
            ratio["streams_decode"] = engine["streams_decode_tok_s"] / peer["streams_decode_tok_s"]
    print(format_table(setup, engine, peer, ratio))
    if args.json:
        print(json.dumps({"engine": engine, "peer": peer, "ratio": ratio, "setup": setup,
                          "runs": {"engine": runs[0], "peer": runs[1] if len(runs) > 1 else []}}))
    return 0


def medians(runs: list[dict]) -> dict:
    """Every numeric figure's median over the repeats."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}


ROWS = [  # (key, label, format, ratio key or None)
    ("load_s", "load time (s)", "{:.2f}", None),
    ("batch1_tok_s", "batch-1 decode (tok/s)", "{:.1f}", "batch1"),
    ("roofline_pct", "  % of decode roofline", "{:.0f}%", None),
    ("streams_tok_s", "N-stream end to end (tok/s)", "{:.1f}", "streams"),
    ("streams_decode_tok_s", "N-stream decode only (tok/s)", "{:.1f}", "streams_decode"),
    ("prefill_tok_s", "prefill (tok/s)", "{:.0f}", "prefill"),
    ("ttft_uncached_ms", "TTFT uncached (ms)", "{:.0f}", None),
    ("ttft_cached_ms", "TTFT cached prefix (ms)", "{:.0f}", None),
    ("ttft_cached_fraction", "  cached / uncached", "{:.1%}", None),
    ("step_ms", "batch-1 step (ms)", "{:.2f}", None),
    ("step_host_overhead_ms", "  host overhead (ms)", "{:.2f}", None),
    ("step_host_overhead_pct", "  host overhead (% of step)", "{:.1f}%", None),
    ("streams_step_ms", "N-stream decode step (ms)", "{:.2f}", None),
    ("streams_step_host_overhead_ms", "  host overhead (ms)", "{:.2f}", None),
    ("streams_step_host_overhead_pct", "  host overhead (% of step)", "{:.1f}%", None),
]


def format_table(setup: dict, engine: dict, peer: dict, ratio: dict) -> str:
    name = setup.get("peer") or "peer"
    lines = [
        f"model {setup['model']} on {setup['device']} ({setup['dtype']}, {setup['weights']} weights, "
        f"{setup['torch_threads']} threads); "
        f"{setup['streams']} streams, prompts {setup['prompt_tokens']}, new {setup['new_tokens']}, "
        f"shared prefix {setup['shared_prefix']} + tail {setup['tail_tokens']}; "
        f"medians of {setup['repeats']} alternating runs",
        f"read bandwidth {setup['read_bandwidth_gb_s']:.1f} GB/s (median of "
        f"{', '.join(map(str, setup['read_bandwidth_readings_gb_s']))}), decode weights "
        f"{setup['decode_weight_bytes'] / 1e6:.0f} MB -> roofline {setup['roofline_tok_s']:.1f} tok/s"
        + (f" (dense weights: {setup['dense_roofline_tok_s']:.1f} tok/s)" if setup["weights"] != "dense" else ""),
        f"memory once loaded and settled: weights {setup['weights_bytes'] / 1e6:.0f} MB, "
        f"RSS {setup.get('rss_bytes', 0) / 1e6:.0f} MB "
        f"(anonymous {setup.get('rss_anon_bytes', 0) / 1e6:.0f} MB), peak {setup['peak_rss_bytes'] / 1e6:.0f} MB; "
        f"file {setup['file_bytes'] / 1e6:.0f} MB",
        "",
        f"{'':32s}{'pagedeck':>12s}" + (f"{name:>14s}{'ratio':>8s}" if peer else ""),
    ]
    for key, label, fmt, rkey in ROWS:
        if key not in engine:
            continue
        row = f"{label:32s}{fmt.format(engine[key]):>12s}"
        if peer:
            row += f"{fmt.format(peer[key]) if key in peer else '-':>14s}"
            row += f"{ratio[rkey]:>7.2f}x" if rkey in ratio else ""
        lines.append(row)
    if ratio:
        lines += ["", f"pagedeck / {name}: batch-1 {ratio['batch1']:.2f}x, {setup['streams']} streams "
                      f"{ratio['streams']:.2f}x, cached-prefix TTFT {ratio['ttft_cached_speedup']:.1f}x faster"]
        if peer.get("note"):
            lines.append(f"note: {peer['note']}")
    return "\n".join(lines)

"""`python -m tools.bench.pages_bench`: many long replies on a cache too small to reserve them all.

--chats chats (default 16) each ask for a long reply of --new-tokens tokens (default 2,048; greedy, no stop
condition: EOS is ignored, as the server's ignore_eos does), all sent at once, on a cache of --cache-tokens
tokens (default 16,384), on one GGUF (default: the embedded default model's file). Three sides, run in
alternating rounds so that drift of a shared machine hits each alike; every figure is the median of --repeats:

- pagedeck: the generator as it is. A job takes pages as it writes; when the pool runs dry the lowest-ranked
  running job gives its pages back and later resumes exactly (engine/generator/preemption.py).
- reservation: the same generator behind the rule it replaced (ExLlamaV2's): this bench submits a chat only
  when the pages nobody has reserved cover its prompt + --new-tokens, and a chat's reservation ends when its
  reply does. Reservations never overlap, so the generator never preempts here (checked).
- llama.cpp: llama.cpp's library (llama-cpp-python, the peers extra) on the same GGUF and token ids, laid out
  as `llama-server -c CACHE -np CHATS` lays it out: one slot per chat, each slot a sequence with
  CACHE / CHATS tokens of its own (kv_unified off); every step one llama_decode carries every slot's next
  token (the prompts go in the first). A slot stops when its share is full (llama-server's context limit
  without context shift), so with the defaults (1,024 tokens a slot) no reply reaches 2,048: the table
  reports how many finished and how many tokens each side produced. llama_cpp.server (the peers extra's
  server) serves one request at a time, and no llama-server binary ships with it, hence the library.

Figures: aggregate tok/s = every generated token / wall time from the start to the last token; TTFT = the
start (every chat is sent then) -> a chat's first token, its p50 and p99 over the chats (queued time
included); finished = replies that reached --new-tokens; peak running = the most chats decoding in one step.
Progress goes to stderr, the table (with the CPU and the command line) to stdout; --json adds one JSON line.
--timeline adds, after each run of a pagedeck side, its steps in phases (consecutive steps with as many chats
running; a step where some chat gave no token, prefilling, refilling lost K/V or preempted, as its own); every
run reports the tokens its resumed chats recomputed.

    python -m tools.bench.pages_bench --threads 2 --repeats 3            # make bench-pages
    python -m tools.bench.pages_bench --chats 2 --new-tokens 32 --repeats 1  # a smoke run
"""
from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.bench.llamacpp import LlamaCpp
from engine.cache.paged_cache import PagedCache
from engine.contract import DEFAULT_PAGE_SIZE, WEIGHT_NAMES, SamplerSettings, check_model_path
from engine.generator.generator import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.model.model_and_tokenizer import load_model_and_tokenizer
from engine.model.weights import default_model_path

TOPICS = ("the sea", "a mountain", "bread", "a violin", "rain", "a library", "trains", "bees", "winter", "a market",
          "clocks", "the moon", "a garden", "bridges", "salt", "kites", "owls", "a river", "glass", "maps")
GREEDY = SamplerSettings.greedy()
SIDES = ("pagedeck", "reservation", "llama.cpp")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    """n chats, each one user message asking for a long essay, in the model's chat template."""
    tokenizer.set_chat_format("auto")
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)] + ("" if i < len(TOPICS) else f", part {i // len(TOPICS) + 1}")
        message = {"role": "user", "content": f"Write a long, detailed essay about {topic}."}
        text = tokenizer.apply_chat_template([message], add_generation_prompt=True)
        out.append(tokenizer.encode(text, encode_special_tokens=True)[0].tolist())
    return out


def summary(t0: float, first: dict, end: dict, tokens: dict, finished: int, **extra) -> dict:
    """One run's figures from per-chat first-token and last-token times and token counts."""
    ttfts = sorted(t - t0 for t in first.values())
    total = sum(tokens.values())
    wall = max(end.values()) - t0
    p99 = statistics.quantiles(ttfts, n=100, method="inclusive")[98] if len(ttfts) > 1 else ttfts[0]
    return {"tok_s": total / wall, "tokens": total, "finished": finished, "wall_s": wall,
            "ttft_p50_s": statistics.median(ttfts), "ttft_p99_s": p99, **extra}


def pagedeck_generator(model, tokenizer, cache_tokens: int) -> DynamicGenerator:
    """One generator on a cache of cache_tokens, warmed up; both pagedeck sides run on it in turn."""
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=cache_tokens, page_size=DEFAULT_PAGE_SIZE), tokenizer)
    gen.warmup()
    return gen


class PagedeckSide:
    """pagedeck's generator on the cache; reserve=True puts the reservation rule in front of it."""

    def __init__(self, gen: DynamicGenerator, prompts: list[list[int]], new_tokens: int, reserve: bool):
        self.name = "reservation" if reserve else "pagedeck"
        self.gen, self.prompts, self.new_tokens, self.reserve = gen, prompts, new_tokens, reserve
        table = gen.pagetable
        self.need = [table.pages_needed(len(p) + new_tokens) for p in prompts]
        if max(self.need) > table.num_pages:
            raise ValueError(f"a chat's prompt + {new_tokens} new tokens needs {max(self.need)} pages; the cache has "
                             f"{table.num_pages} pages of {table.page_size}")
        for job in self._jobs():  # what the generator's context can't hold is refused before any timing
            gen.check_job(job)

    def _jobs(self) -> list[DynamicJob]:
        # no stop conditions: EOS is ignored, every reply runs to new_tokens
        return [DynamicJob(torch.tensor([p]), self.new_tokens, gen_settings=GREEDY) for p in self.prompts]

    def run(self) -> dict:
        gen = self.gen
        gen.reset_page_table()
        before = gen.metrics()
        self.steps = []  # (seconds, chats running in the step, tokens it produced)
        jobs = self._jobs()
        waiting = list(range(len(jobs)))  # not yet submitted (the reservation rule holds them back)
        reserved: dict[DynamicJob, int] = {}
        first, end, tokens, finished, peak = {}, {}, dict.fromkeys(jobs, 0), 0, 0
        t0 = time.perf_counter()
        if not self.reserve:
            gen.enqueue(jobs)
            waiting = []
        while waiting or gen.num_remaining_jobs():
            while waiting and gen.pagetable.num_pages - sum(reserved.values()) >= self.need[waiting[0]]:
                i = waiting.pop(0)
                reserved[jobs[i]] = self.need[i]
                gen.enqueue(jobs[i])
            step_start, running = time.perf_counter(), len(gen.active)
            results = gen.iterate()
            now = time.perf_counter()
            peak = max(peak, len(gen.active))
            made = sum(len(r.get("token_ids", ())) for r in results)
            self.steps.append((now - step_start, max(running, len(gen.active)), made))  # admitted ones, ended ones
            for r in results:
                if r["stage"] != "streaming":
                    continue
                job = r["job"]
                tokens[job] += len(r["token_ids"])
                if r["token_ids"]:
                    first.setdefault(job, now)
                if r["eos"]:
                    end[job] = now
                    finished += r["eos_reason"] == "max_new_tokens" and tokens[job] == self.new_tokens
                    reserved.pop(job, None)
        after = gen.metrics()
        preemptions = after["preemptions_total"] - before["preemptions_total"]
        if self.reserve and preemptions:
            raise RuntimeError(f"the reservation side preempted {preemptions} times: its reservations overlapped")
        return summary(t0, first, end, tokens, finished, peak_running=peak, preemptions=preemptions,
                       recomputed=after["recomputed_tokens_total"] - before["recomputed_tokens_total"])

    def close(self) -> None:
        self.gen = None


def phases(steps: list[tuple[float, int, int]]) -> list[str]:
    """A run's steps as phases: consecutive steps with as many chats running that gave each of them a token; a
    step that gave fewer (a prompt or lost K/V filled, a chat preempted) is a phase of its own."""
    rows: list[list] = []  # [running, steps, seconds, tokens, refill]
    for secs, running, made in steps:
        refill = made < running
        if rows and not refill and not rows[-1][4] and rows[-1][0] == running:
            rows[-1][1:4] = [rows[-1][1] + 1, rows[-1][2] + secs, rows[-1][3] + made]
        else:
            rows.append([running, 1, secs, made, refill])
    return [f"{running:3d} running, {n:5d} steps, {secs:7.2f} s, {made:6d} tokens, {secs / n * 1000:7.1f} ms a step"
            + (" (some gave no token: prefilling, refilling or preempted)" if refill else "") for running, n, secs, made, refill in rows]


class LlamaServerSlots:
    """llama.cpp laid out as llama-server's slots: one sequence per chat, each with cache_tokens / chats."""

    name = "llama.cpp"

    def __init__(self, path: Path, prompts: list[list[int]], new_tokens: int, cache_tokens: int, threads: int):
        self.prompts, self.new_tokens = prompts, new_tokens
        self.slot_tokens = cache_tokens // len(prompts)
        if max(len(p) for p in prompts) >= self.slot_tokens:
            raise ValueError(f"a prompt does not fit in a llama-server slot of {self.slot_tokens} tokens")
        self.runner = LlamaCpp(path, n_ctx=cache_tokens, n_seq=len(prompts), threads=threads, unified=False)
        log(f"llama.cpp: loaded {path.name} in {self.runner.load_s:.2f} s, {len(prompts)} slots of "
            f"{self.slot_tokens} tokens")
        self.runner.decode([(0, prompts[0], 0)])  # warm-up
        self.runner.clear()

    def run(self) -> dict:
        runner, n = self.runner, self.new_tokens
        runner.clear()
        t0 = time.perf_counter()
        nxt = runner.decode([(s, p, 0) for s, p in enumerate(self.prompts)])
        now = time.perf_counter()
        first = dict.fromkeys(range(len(self.prompts)), now)
        end, tokens = {}, dict.fromkeys(first, 1)
        peak = 0
        while True:
            # a slot goes on while its reply is short of n and its share holds prompt + reply after one more
            # token (llama-server stops a slot at n_past + 1 >= its n_ctx without context shift)
            live = [s for s, p in enumerate(self.prompts)
                    if s not in end and tokens[s] < n and len(p) + tokens[s] < self.slot_tokens]
            for s in first:
                if s not in end and s not in live:
                    end[s] = now
            if not live:
                break
            peak = max(peak, len(live))
            out = runner.decode([(s, [nxt[s]], len(self.prompts[s]) + tokens[s] - 1) for s in live])
            now = time.perf_counter()
            for s, tok in zip(live, out):
                nxt[s] = tok
                tokens[s] += 1
        finished = sum(1 for s in tokens if tokens[s] == n)
        runner.clear()
        return summary(t0, first, end, tokens, finished, peak_running=peak, preemptions=0)

    def close(self) -> None:
        self.runner.close()


def medians(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def format_table(setup: dict, table: dict[str, dict]) -> str:
    lines = [f"CPU: {setup['cpu']}; {setup['threads']} threads",
             f"command: {setup['command']}",
             f"{setup['chats']} chats x {setup['new_tokens']} new tokens (ignore EOS, greedy) on a "
             f"{setup['cache_tokens']}-token cache; {setup['model']} ({setup['weights']} weights); "
             f"medians of {setup['repeats']} alternating runs", "",
             f"{'side':<13}{'finished':>10}{'tokens':>9}{'tok/s':>9}{'TTFT p50 s':>12}{'TTFT p99 s':>12}"
             f"{'peak running':>14}{'preempted':>11}"]
    for name, r in table.items():
        lines.append(f"{name:<13}{r['finished']:>7.0f}/{setup['chats']:<2}{r['tokens']:>9.0f}{r['tok_s']:>9.1f}"
                     f"{r['ttft_p50_s']:>12.2f}{r['ttft_p99_s']:>12.2f}{r['peak_running']:>14.0f}"
                     f"{r['preemptions']:>11.0f}")
    if "pagedeck" in table:
        base = table["pagedeck"]
        for name, r in table.items():
            if name != "pagedeck":
                lines.append(f"pagedeck / {name}: tok/s {base['tok_s'] / r['tok_s']:.2f}x, TTFT p50 "
                             f"{base['ttft_p50_s'] / r['ttft_p50_s']:.2f}x and p99 "
                             f"{base['ttft_p99_s'] / r['ttft_p99_s']:.2f}x (below 1: pagedeck's come sooner)")
    if "llama.cpp" in table:
        lines.append(f"note: llama.cpp's slots hold {setup['cache_tokens'] // setup['chats']} tokens each "
                     f"(llama-server -c {setup['cache_tokens']} -np {setup['chats']}): its replies stop at that limit")
    return "\n".join(lines)


def ratios(table: dict[str, dict]) -> dict:
    """pagedeck's figures over each other side's (tok/s above 1 and TTFT below 1 favour pagedeck)."""
    base = table.get("pagedeck")
    if base is None:
        return {}
    return {name: {"tok_s": base["tok_s"] / r["tok_s"], "ttft_p50": base["ttft_p50_s"] / r["ttft_p50_s"],
                   "ttft_p99": base["ttft_p99_s"] / r["ttft_p99_s"]}
            for name, r in table.items() if name != "pagedeck"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.pages_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", metavar="GGUF", help="a .gguf file (default: the embedded default model's)")
    ap.add_argument("--weights", choices=WEIGHT_NAMES, default="packed",
                    help="pagedeck's weights (default packed: the GGUF's own blocks, as llama.cpp reads them)")
    ap.add_argument("--chats", type=int, default=16, help="chats sent at once (default 16)")
    ap.add_argument("--new-tokens", type=int, default=2048, help="tokens each reply asks for (default 2048)")
    ap.add_argument("--cache-tokens", type=int, default=16384, help="the K/V cache, in tokens (default 16384)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each side (medians reported)")
    ap.add_argument("--threads", type=int, help="torch and llama.cpp threads (default: torch's)")
    ap.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES), help="sides to run (default all)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    ap.add_argument("--timeline", action="store_true", help="log each pagedeck-side run's steps in phases")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("chats", "new_tokens", "cache_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model is not None else default_model_path()
    check_model_path(str(path))
    if path.suffix.lower() != ".gguf":
        raise SystemExit(f"--model must be a .gguf file (llama.cpp reads the same file), got {path}")
    model, tokenizer = load_model_and_tokenizer(str(path), weights=args.weights)
    prompts = chat_prompts(tokenizer, args.chats)
    log(f"pagedeck: {model.name} ({model.weight_format} weights), prompts of {min(map(len, prompts))}-"
        f"{max(map(len, prompts))} tokens")
    sides = []
    gen = pagedeck_generator(model, tokenizer, args.cache_tokens) if set(args.sides) - {"llama.cpp"} else None
    try:
        for name in args.sides:
            if name == "llama.cpp":
                sides.append(LlamaServerSlots(path, prompts, args.new_tokens, args.cache_tokens,
                                              torch.get_num_threads()))
            else:
                sides.append(PagedeckSide(gen, prompts, args.new_tokens, reserve=name == "reservation"))
        runs: dict[str, list[dict]] = {side.name: [] for side in sides}
        for r in range(args.repeats):  # alternate, so drift on a shared machine hits every side alike
            for side in sides:
                log(f"-- repeat {r + 1}/{args.repeats}: {side.name}")
                runs[side.name].append(side.run())
                log(f"   {runs[side.name][-1]}")
                if args.timeline and isinstance(side, PagedeckSide):
                    for line in phases(side.steps):
                        log(f"   {line}")
    finally:
        for side in sides:
            side.close()
    table = {name: medians(rs) for name, rs in runs.items()}
    setup = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "model": path.name,
             "weights": model.weight_format, "chats": args.chats, "new_tokens": args.new_tokens,
             "cache_tokens": args.cache_tokens, "page_size": DEFAULT_PAGE_SIZE, "repeats": args.repeats,
             "command": shlex.join(["python", "-m", "tools.bench.pages_bench",
                                    *(sys.argv[1:] if argv is None else argv)]),
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(format_table(setup, table))
    if args.json:
        print(json.dumps({"setup": setup, "medians": table, "ratios": ratios(table), "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m tools.bench.busy_load`: how long a model and its tokenizer take to load, on quiet cores and on
cores that other processes keep busy (a model loading while another one serves, a build running beside the
app), each load in a fresh process, as a user starts one.

`--busy N` starts N busy-loop processes before each busy run and stops them after it. `--baseline-tree DIR`
times another checkout (a `git worktree` of an earlier commit, its kernels built there) in the same
alternation, so both sides see the same drift. Printed: every run's seconds and, per side and condition, the
median of --repeats runs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

_LOAD = """
import sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
from engine import load_model_and_tokenizer
t0 = time.perf_counter()
loaded = load_model_and_tokenizer(sys.argv[1] or None, weights="packed")  # kept: freeing it is not the load
print(time.perf_counter() - t0)
"""

_BUSY = "while True:\n    pass\n"
ROOT = Path(__file__).resolve().parents[2]


def timed_load(tree: Path, model: str, threads: int, busy: int) -> float:
    """Seconds of load_model_and_tokenizer in a fresh process run from `tree`, beside `busy` busy loops."""
    hogs = [subprocess.Popen([sys.executable, "-c", _BUSY]) for _ in range(busy)]
    try:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run([sys.executable, "-c", _LOAD, model, str(threads)], cwd=tree, env=env, check=True,
                             capture_output=True, text=True)
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.busy_load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="a model file or folder (default: the embedded model)")
    ap.add_argument("--busy", type=int, default=2, help="busy-loop processes beside the busy runs (default 2)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the loading process")
    ap.add_argument("--baseline-tree", type=Path, help="another checkout, timed in the same alternation")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.busy < 1 or args.threads < 1:
        raise SystemExit("--repeats, --busy and --threads must be at least 1")
    sides = {"current": ROOT}
    if args.baseline_tree is not None:
        if not (args.baseline_tree / "engine").is_dir():
            raise SystemExit(f"--baseline-tree {args.baseline_tree} is not a pagedeck checkout")
        sides["baseline"] = args.baseline_tree.resolve()
    runs: dict[tuple[str, str], list[float]] = {}
    for r in range(args.repeats):
        for condition, busy in (("quiet", 0), (f"{args.busy} busy", args.busy)):
            for name, tree in sides.items():
                secs = timed_load(tree, args.model, args.threads, busy)
                runs.setdefault((name, condition), []).append(secs)
                print(f"repeat {r + 1}: {name}, {condition}: {secs:.2f} s", flush=True)
    print(f"model: {args.model or 'the embedded default'}; {args.threads} threads; medians of {args.repeats}")
    for (name, condition), secs in runs.items():
        print(f"  {name:8s} {condition:8s} {statistics.median(secs):6.2f} s  ({', '.join(f'{s:.2f}' for s in secs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

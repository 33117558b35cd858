"""`make bench-big`'s run: each big file (tools.bench.bench_big, built where missing) benchmarked against
llama.cpp by `python -m engine bench --model FILE --weights packed --threads 2 --peer llama.cpp --repeats 3`,
one process per file, and the figures gathered into a markdown table with the CPU, the commit, the versions
and the exact command beside them: `python -m tools.bench.big_results [--out FILE.md] [NAME ...]`.

The table is rewritten after each file, so an interrupted run keeps what it measured. Extra arguments after
`--` go to every bench command (a smoke run's `--repeats 1 --new-tokens 4`, say).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from tools.bench import bench_big

ROOT = Path(__file__).resolve().parents[2]
BENCH = ["--weights", "packed", "--threads", "2", "--peer", "llama.cpp", "--repeats", "3"]
COLUMNS = "| file | size | load | batch-1 decode (% of roofline) | N streams end to end (decode only) | prefill | " \
          "TTFT, cached prefix | pagedeck RSS after load / file |\n| --- | --- | --- | --- | --- | --- | --- | --- |"


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, and its logical core count."""
    import os

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} logical cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical cores"


def commit() -> str:
    """HEAD's short hash, "+ uncommitted changes" when the tree differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def row(name: str, path: Path, r: dict) -> str:
    """One table row from `engine bench --json`'s object: pagedeck's figure vs llama.cpp's, and the ratio."""
    e, p, x, s = r["engine"], r["peer"], r["ratio"], r["setup"]
    decode = f"{x['streams_decode']:.2f}x" if "streams_decode" in x else "-"
    size = path.stat().st_size
    rss = f"{s['rss_bytes'] / size:.2f}" if s.get("rss_bytes") else "-"
    return (f"| {name} | {size / 1e6:,.0f} MB | {e['load_s']:.2f} s vs {p['load_s']:.2f} s "
            f"| **{x['batch1']:.2f}x** ({e['batch1_tok_s']:.1f} vs {p['batch1_tok_s']:.1f} tok/s; "
            f"{e['roofline_pct']:.0f} % vs {p['roofline_pct']:.0f} %) | **{x['streams']:.2f}x** ({decode}) "
            f"| {x['prefill']:.2f}x | {e['ttft_cached_ms']:.0f} vs {p['ttft_cached_ms']:.0f} ms | {rss} |")


def run(names: list[str], out: Path, extra: list[str], log=print) -> Path:
    """Benchmark each file of `names` and (re)write the table to `out` after each; returns `out`."""
    import llama_cpp

    rows, started = [], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = " ".join(["python -m engine bench --model FILE", *BENCH, *extra])
    for name in names:
        path = bench_big.build(name, log=log)
        cmd = [sys.executable, "-m", "engine", "bench", "--model", str(path), *BENCH, *extra, "--json"]
        log(f"== {name}: {' '.join(cmd[1:])}")
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        lines = proc.stdout.strip().splitlines()
        log("\n".join(lines[:-1]))
        if proc.returncode != 0 or not lines:
            rows.append(f"| {name} | failed (exit {proc.returncode}) |")
        else:
            rows.append(row(name, path, json.loads(lines[-1])))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            f"# make bench-big, {started}\n\n"
            f"- CPU: {cpu_name()}\n- commit: {commit()}\n"
            f"- llama-cpp-python {llama_cpp.__version__}, Python {platform.python_version()}\n"
            f"- command, each file: `{command}`\n"
            f"- files: `python -m tools.bench.bench_big build NAME` ({bench_big.cache_dir()}); pagedeck vs llama.cpp, "
            f"medians; ratios > 1x favour pagedeck\n\n{COLUMNS}\n" + "\n".join(rows) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"which files (default: {', '.join(bench_big.BIG)})")
    ap.add_argument("--out", type=Path, default=None, help="the table (default: CACHE/bench-big.md)")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    unknown = [n for n in args.names if n not in bench_big.FILES]
    if unknown:
        ap.error(f"unknown file {unknown[0]!r}; known: {', '.join(bench_big.FILES)}")
    out = run(args.names or list(bench_big.BIG), args.out or bench_big.cache_dir() / "bench-big.md", extra,
              log=lambda m: print(m, flush=True, file=sys.stderr))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

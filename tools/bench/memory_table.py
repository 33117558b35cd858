"""`python -m tools.bench.memory_table`: what loading a GGUF costs in memory, pagedeck beside llama.cpp.

Each measurement runs in its own process (so one model's pages never count towards another's) and reads
/proc/self/status: VmRSS after the imports (the baseline), then VmRSS after loading, VmHWM (the peak of
loading) and VmRSS after a 4-token prompt (the first use, which maps what a lazy loader left on disk: llama.cpp
memory-maps the file). Every figure is less the baseline, against the file's size. pagedeck's rows also give
the weight figure the app shows (Model.memory_bytes()) and the estimate made before loading
(engine.estimate_memory), with the dense fp32 copy for prompt rows on (the default rule) and off
(PAGEDECK_DENSE_COPY=0). The files: the embedded default model, a Gemma-3-270M-shaped file (262k
vocabulary, its Q8_0 embedding the tied head) and an 8B-shaped Q4_K_M file of 8 layers, both written by
tools.models.synthetic_gguf into --dir when missing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SYNTHETIC = {  # file name -> tools.models.synthetic_gguf arguments
    "gemma3-270m-like.gguf": ["--shape", "gemma3-270m", "--layers", "18", "--vocab", "262144", "--tied"],
    "llama3-8b-8L.gguf": ["--shape", "llama3-8b", "--layers", "8"],
}
PROMPT = [1, 300, 301, 302]


def _status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak() -> None:
    """Start VmHWM from the current RSS (Linux >= 4.0), so the peak is loading's, not the imports'."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def child_pagedeck(path: str) -> dict:
    import torch

    import kernels
    from engine import Model, PagedCache, estimate_memory
    from engine.model.batch import Batch

    kernels.packed.q4_supported()  # the CPU kernels loaded (built once) before the baseline
    est = estimate_memory(path, weights="auto", cache_tokens=256).weights_bytes
    base = _status()
    _reset_peak()
    model = Model.load(path, weights="auto", check_memory=False)
    loaded = _status()
    cache = PagedCache(model, max_tokens=256, page_size=16)
    with torch.inference_mode():
        model.forward(Batch.build([(PROMPT, 0, [0])], 16, [1], prompt_seqs=[True]), cache)
    used = _status()
    return {"base": base, "loaded": loaded, "used": used, "estimate": est, "memory_bytes": model.memory_bytes(),
            "format": model.weight_format, "dense_copy": model.prompt_dense}


def child_llamacpp(path: str) -> dict:
    import llama_cpp

    base = _status()
    _reset_peak()
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=64, verbose=False)  # use_mmap: its default
    loaded = _status()
    llm.eval(PROMPT)
    return {"base": base, "loaded": loaded, "used": _status()}


def measure(side: str, path: Path, dense_copy: bool = True, timeout: float = 1800) -> dict | None:
    """One measurement in a fresh process; None when it failed (its stderr is printed)."""
    env = dict(os.environ)
    if not dense_copy:
        env["PAGEDECK_DENSE_COPY"] = "0"
    cmd = [sys.executable, "-m", "tools.bench.memory_table", "--child", side, str(path)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if run.returncode != 0:
        print(f"{side} on {path.name} failed:\n{run.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(run.stdout.strip().splitlines()[-1])


def _cell(n: float, file_bytes: int) -> str:
    return f"{n / 1e6:,.0f} MB ({n / file_bytes:.2f}x)"


def row(name: str, side: str, r: dict | None, file_bytes: int) -> str:
    if r is None:
        return f"| {name} | {side} | failed | | | | |"
    b = r["base"]["VmRSS"]
    after = r["loaded"]["VmRSS"] - b
    peak = r["loaded"]["VmHWM"] - b
    used = r["used"]["VmRSS"] - b
    shown = f"{_cell(r['memory_bytes'], file_bytes)} (estimate {r['estimate'] / 1e6:,.0f} MB)" if "estimate" in r else "-"
    return (f"| {name} | {side} | {shown} | {_cell(after, file_bytes)} | {_cell(peak, file_bytes)} | "
            f"{_cell(used, file_bytes)} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp", help="where the synthetic files are (written when missing)")
    ap.add_argument("--only", nargs="*", default=None, help="file names to measure (default: all three)")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("SIDE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        side, path = args.child
        result = child_pagedeck(path) if side == "pagedeck" else child_llamacpp(path)
        print(json.dumps(result))
        return 0

    from engine.model.weights import default_model_path

    files = [default_model_path()]
    for name, gen in SYNTHETIC.items():
        path = Path(args.dir) / name
        if not path.exists():
            subprocess.run([sys.executable, "-m", "tools.models.synthetic_gguf", str(path), *gen], check=True)
        files.append(path)
    if args.only:
        files = [f for f in files if f.name in args.only]
    print("| file (size) | loader | weights held, as shown (x file) | RSS after load (x file) | peak RSS while "
          "loading | RSS after a 4-token prompt |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path in files:
        size = path.stat().st_size
        name = f"{path.name} ({size / 1e6:,.0f} MB)"
        for copy in (True, False):
            r = measure("pagedeck", path, copy)
            if copy and r is not None and not r["dense_copy"]:  # the rule keeps no copy: one row says it all
                print(row(name, "pagedeck (no dense copy by rule)", r, size), flush=True)
                break
            print(row(name, f"pagedeck, dense copy {'on' if copy else 'off'}", r, size), flush=True)
        if not args.no_llama_cpp:
            print(row(name, "llama.cpp (mmap)", measure("llamacpp", path), size), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

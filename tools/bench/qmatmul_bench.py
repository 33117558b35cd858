"""How the packed matmul kernel scales with threads on the default model's shapes:
`python -m tools.bench.qmatmul_bench [--rows 1,8] [--threads 1,2] [--rounds 5]`.

`--prompt-rows 128,512 [--gemm-format q6|q5k|iq4xs] [--gemm-shapes qwen2.5-1.5b]` instead times the prompt-rows
(GEMM) path against the per-weight-row path on random Q4 (or Q6_K, Q5_K, IQ4_XS) matrices of Llama-3-8B's (or
Qwen2.5-1.5B's) shapes (kernels.cpu_ext.set_tuning switches paths per call; both give the same
bits), alternating the two round by round, in process CPU time (robust on a shared machine) and wall time.
`--stream [--model FILE]` times what a batch-1 decode step streams from memory: each matrix class's one-row
calls over all layers in order (q|k|v, o, gate|up, down; then the output head), as the step makes them, so the
weights come from DRAM, not cache; ms a token and GB/s, medians of --rounds, each thread count in turn.
`--q6` times the q6 format (Q6_K super-blocks as stored) against the q8 they used to become, one-row calls
on Llama-3-8B's down and output-head shapes (tools.bench._q6_bench), the same way, with GB/s.
`--q8-groups 262144x640` times q8 rows against the same rows regrouped 16 at a time (q8g, tools.bench._q8g_bench) at
each of --rows, alternating call by call, on a random matrix of that shape (a 262k-token output head's).
`--mxfp4` times one-row calls on gpt-oss-shaped MXFP4 expert matrices against q8 ones of the same bytes, from
DRAM, each of --threads (tools.bench._lut4_bench).

Each kernel call (torch.ops.pagedeck.qmatmul, no Python layer around it) on one layer's q|k|v, o, gate|up
(SwiGLU epilogue) and down matrices and on the output head, alternating thread counts round by round,
medians. Per weight row: (the call - the same call on the matrix's first 8 weight rows) / (weight rows - 8),
i.e. without the fixed cost of a call, so it shows whether the kernel's work itself halves on two threads.
Last, the cost of one parallel region with an empty body (the `parallel_threads()` op) per thread count:
what each matmul's fork/join adds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.model.model import Model
from engine.model.qlinear import Q4Linear, Q8Linear
from kernels import cpu_ext
from kernels.packed import ACTIVATIONS, pad_scales
from tools.bench._qgemm_bench import FORMATS, SHAPE_SETS
from tools.bench._qgemm_bench import run as gemm_run


def _time(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.qmatmul_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8", help="activation rows per call")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-rows", default="", help="e.g. 128,512: GEMM path vs per-row path")
    ap.add_argument("--gemm-format", default="q4", choices=list(FORMATS), help="with --prompt-rows: the weights' format")
    ap.add_argument("--gemm-shapes", default="llama3-8b", choices=list(SHAPE_SETS),
                    help="with --prompt-rows: whose matrix shapes")
    ap.add_argument("--q6", action="store_true", help="q6 vs q8 one-row calls on 8B shapes (rows: first of --rows)")
    ap.add_argument("--q8-groups", default="", metavar="NxK", help="q8 rows vs q8g groups on a random N x K matrix")
    ap.add_argument("--mxfp4", action="store_true", help="mxfp4 vs q8 one-row calls from DRAM, gpt-oss expert shapes")
    ap.add_argument("--stream", action="store_true", help="a decode step's weight stream, per matrix class")
    ap.add_argument("--model", default=None, help="with --stream: a .gguf (default: the embedded model)")
    args = ap.parse_args(argv)
    ops = cpu_ext.ops()
    if ops is None:
        raise SystemExit("pagedeck's CPU kernels are not available here")
    if args.q6:
        from tools.bench._q6_bench import run as q6_run

        return q6_run(int(args.rows.split(",")[0]), int(args.threads.split(",")[-1]), args.rounds)
    if args.mxfp4:
        from tools.bench._lut4_bench import run as lut4_run

        return lut4_run(ops, [int(t) for t in args.threads.split(",")], args.rounds)
    if args.q8_groups:
        from tools.bench._q8g_bench import run as q8g_run

        return q8g_run(args.q8_groups, [int(r) for r in args.rows.split(",")], int(args.threads.split(",")[-1]),
                       args.rounds)
    if args.prompt_rows:
        return gemm_run(ops, [int(r) for r in args.prompt_rows.split(",")], int(args.threads.split(",")[0]),
                        args.rounds, args.gemm_format, args.gemm_shapes)
    if args.stream:
        return stream(Model.load(args.model, weights="packed"), [int(t) for t in args.threads.split(",")],
                      args.rounds)
    model = Model.load(weights="packed")
    layer = model.layers[0]
    shapes = {"qkv": (layer.qkv, None), "o": (layer.o, None), "gate_up": (layer.gate_up, "swiglu"),
              "down": (layer.down, None), "head": (model.lm_head, None)}
    stub = {}  # the first 8 rows of each matrix: the fixed cost of a call
    for name, (w, _) in shapes.items():
        if isinstance(w, Q4Linear):  # in rows (8 rows are no group)
            qs, d, m = w.rows(0, 8)
            stub[name] = Q4Linear.from_packed(qs.contiguous(), pad_scales(d), pad_scales(m))
        else:
            qs, d, m = w.blocks
            stub[name] = Q8Linear.from_packed(qs[:8], d[:8])
    threads = [int(t) for t in args.threads.split(",")]
    times: dict = {}
    region: dict = {}
    for _ in range(args.rounds):
        for t in threads:
            torch.set_num_threads(t)
            region.setdefault(t, []).append(_time(ops.parallel_threads, 2000))
            for rows in (int(r) for r in args.rows.split(",")):
                for name, (w, act) in shapes.items():
                    x = torch.randn(rows, w.shape[1])
                    reps = 20 if name == "head" else 400
                    full = _time(lambda: ops.qmatmul(x, *w.blocks, w.kernel_id, ACTIVATIONS[act]), reps)
                    s = stub[name]
                    fixed = _time(lambda: ops.qmatmul(x, *s.blocks, s.kernel_id, ACTIVATIONS[act]), reps)
                    times.setdefault((rows, name, t), []).append((full, fixed))
    print(f"{model.name}, packed weights; medians of {args.rounds} alternating rounds")
    print("| rows | matrix | shape | threads | us a call | ns a weight row | GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (rows, name, t), runs in times.items():
        w = shapes[name][0]
        full = statistics.median(r[0] for r in runs)
        per_row = statistics.median((r[0] - r[1]) / (w.shape[0] - 8) for r in runs)
        print(f"| {rows} | {name} | {w.shape[0]}x{w.shape[1]} {w.format} | {t} | {full * 1e6:.1f} | "
              f"{per_row * 1e9:.1f} | {w.nbytes() / full / 1e9:.1f} |")
    print("an empty parallel region (parallel_threads(), with the op call): " +
          ", ".join(f"{statistics.median(v) * 1e6:.1f} us on {t} thread{'s' if t > 1 else ''}"
                    for t, v in region.items()))
    return 0


def stream(model: Model, threads: list[int], rounds: int) -> int:
    """--stream: per matrix class, one row through every layer's matrix in turn (and the head)."""
    if model.settle_thread is not None:
        model.settle_thread.join()  # the weights as decode reads them once loading has settled
    classes = {name: [getattr(layer, name) for layer in model.layers] for name in ("qkv", "o", "gate_up", "down")}
    classes["head"] = [model.lm_head]
    print(f"{model.name}: one-row calls over all {len(model.layers)} layers, medians of {rounds}")
    print("| threads | matrices | formats | MB a token | ms a token | GB/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for t in threads:
        torch.set_num_threads(t)
        for name, ws in classes.items():
            act = "swiglu" if name == "gate_up" else None
            x = torch.randn(1, ws[0].shape[1])
            runs = []
            for _ in range(rounds + 1):
                start = time.perf_counter()
                for w in ws:
                    w(x, act)
                runs.append(time.perf_counter() - start)
            sec, nbytes = statistics.median(runs[1:]), sum(w.nbytes() for w in ws)
            formats = "+".join(sorted({w.format if w.format != "parts" else "|".join(p.format for p in w.parts)
                                       for w in ws}))
            print(f"| {t} | {name} | {formats} | {nbytes / 1e6:.0f} | {sec * 1e3:.2f} | {nbytes / sec / 1e9:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

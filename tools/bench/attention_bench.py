"""The decode step's attention alone: `python -m tools.bench.attention_bench [--rows 16] [--lens 1000:2000]
[--layers 30] [--threads 2] [--dtypes float32,float16] [--baseline REV] [--rounds 7] [--clock wall|cpu]
[--heads 9:3:64] [--prefill T]`.

kernels/cpu/attention.cpp's attend (rotary, K/V write, attention of one new token a row) is run for --layers
layers of the default model's shape (9 query heads over 3 KV heads of 64 dims, pools of 256-token pages
of each of --dtypes, pages shuffled over the pool as a long-running cache leaves them), --rows rows whose context lengths
are spread evenly over --lens. A step is one call per layer, as kernels.decode_layers makes them. Printed:
the step's median time, the K/V bytes it reads (each row's cached positions x layers x K and V) and what
that is per second, beside the machine's read bandwidth (a torch sum over a tensor far bigger than the
caches, on the same threads) and copy bandwidth (torch's copy_, counted as bytes read + written).
`--heads HQ:HKV:D` takes another model's heads (Qwen2.5-1.5B: 12:2:128); `--prefill T` instead times a prompt's
attention: one sequence of T query rows over its own T positions per layer (what a T-token prefill chunk costs), with
the multiply-adds per second (QK and PV, the causal half).

--baseline REV also builds attention.cpp as it was at git revision REV (its op under another namespace) and
runs it on the same pools (of each of --dtypes: the revision must take them). Every side (each dtype, and the baseline) runs in alternating rounds, so that a busy shared
machine's drift hits each alike; each figure is the median over --rounds rounds. `--clock cpu` counts this
thread's CPU time, which other processes disturb less than wall time; it sees only the calling thread, so
use it with --threads 1.
"""
from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import torch

from kernels import cpu_ext

ROOT = Path(__file__).resolve().parents[2]
PAGE = 256


def baseline_op(rev: str):
    """attention.cpp at git revision rev (with that revision's headers), built on its own with its op renamed to
    pagedeck_base::attend."""
    tag = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    folder = Path(tempfile.gettempdir()) / f"pagedeck_attention_{tag}"
    folder.mkdir(exist_ok=True)
    archive = subprocess.run(["git", "archive", rev, "kernels/cpu"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    source = folder / "kernels" / "cpu" / "attention.cpp"
    source.write_text(source.read_text().replace("TORCH_LIBRARY_FRAGMENT(pagedeck,", "TORCH_LIBRARY_FRAGMENT(pagedeck_base,"))
    from torch.utils.cpp_extension import load

    load(name=f"pagedeck_attention_{tag}", sources=[str(source)], extra_include_paths=[str(source.parent)],
         extra_cflags=cpu_ext.CFLAGS, extra_ldflags=cpu_ext.LDFLAGS, is_python_module=False)
    return torch.ops.pagedeck_base.attend


class Step:
    """One decode step's inputs: pools per layer, rows' page tables and lengths, and q|k|v rows."""

    def __init__(self, rows: int, lo: int, hi: int, layers: int, dtype: torch.dtype, heads=(9, 3, 64),
                 prefill: int = 0, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.heads, self.prefill = heads, prefill
        HQ, HKV, D = heads
        if prefill:
            rows, lo, hi = 1, prefill, prefill
        self.lens = [lo + (hi - lo) * i // max(rows - 1, 1) for i in range(rows)]
        need = [-(-n // PAGE) for n in self.lens]
        pages = sum(need) + 1
        perm = torch.randperm(pages, generator=g)
        self.table = torch.zeros(rows, max(need), dtype=torch.int32)
        used = 0
        for b, n in enumerate(need):
            self.table[b, :n] = perm[used:used + n].to(torch.int32)
            used += n
        self.pools = [tuple(torch.randn(pages, PAGE, HKV, D, generator=g).to(dtype) for _ in "kv")
                      for _ in range(layers)]
        q_rows = prefill or rows
        self.qkv = torch.randn(q_rows, (HQ + 2 * HKV) * D, generator=g)
        self.cu = torch.tensor([0, prefill], dtype=torch.int32) if prefill else torch.arange(rows + 1, dtype=torch.int32)
        self.kv = torch.tensor(self.lens, dtype=torch.int32)
        pos = torch.arange(prefill) if prefill else self.kv.long() - 1
        seq = [0] * prefill if prefill else range(rows)
        self.slots = torch.stack([self.table[b, int(p) // PAGE].long() * PAGE + int(p) % PAGE
                                  for b, p in zip(seq, pos)])
        inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
        ang = pos[:, None].float() * inv[None]
        self.cos, self.sin = ang.cos().contiguous(), ang.sin().contiguous()

    def kv_bytes(self) -> int:
        _, HKV, D = self.heads
        return sum(self.lens) * len(self.pools) * 2 * HKV * D * self.pools[0][0].element_size()

    def macs(self) -> int:
        """A prefill's multiply-adds: QK and PV over the causal half, every query head and layer."""
        HQ, _, D = self.heads
        return 2 * HQ * D * self.prefill * (self.prefill + 1) // 2 * len(self.pools)

    def run(self, op) -> torch.Tensor:
        out = None
        HQ, _, D = self.heads
        for k, v in self.pools:
            out, _ = op(self.qkv, k, v, self.cos, self.sin, self.slots, self.table, self.cu, self.kv, HQ, D ** -0.5,
                        max(16, self.prefill))
        return out


def timed(fn, repeat: int, clock=time.perf_counter) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        t = clock()
        fn()
        ts.append(clock() - t)
    return statistics.median(ts)


def bandwidth() -> tuple[float, float]:
    """(read GB/s of a sum, copy GB/s counting read + write) over 512 MiB, on torch's threads."""
    a = torch.ones(128 * 2**20)
    b = torch.empty_like(a)
    read = a.numel() * 4 / timed(lambda: a.sum(), 5) / 1e9
    copy = 2 * a.numel() * 4 / timed(lambda: b.copy_(a), 5) / 1e9
    return read, copy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.attention_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--lens", default="1000:2000", help="LO:HI, the rows' context lengths spread evenly")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default="float32", help="the K/V pools' element types, comma-separated "
                    "(float32, float16)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=5, help="steps timed per round (their median is the round's)")
    ap.add_argument("--baseline", default=None, help="a git revision whose attention.cpp runs alongside")
    ap.add_argument("--heads", default="9:3:64", help="HQ:HKV:D, query heads, KV heads and head dims")
    ap.add_argument("--prefill", type=int, default=0, help="T: one T-token prompt chunk instead of decode rows")
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.lens.split(":"))
    if not 1 <= lo <= hi or args.rows < 1 or args.layers < 1:
        ap.error("--lens wants 1 <= LO <= HI, --rows and --layers at least 1")
    dtypes = args.dtypes.split(",")
    if set(dtypes) - {"float32", "float16"}:
        ap.error(f"--dtypes takes float32 and float16, got {args.dtypes}")
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu sees the calling thread only: use it with --threads 1")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    ops = cpu_ext.ops()
    if ops is None:
        raise SystemExit("pagedeck's CPU kernels are not available here (PAGEDECK_CPU_KERNELS=0 or no compiler)")
    heads = tuple(int(x) for x in args.heads.split(":"))
    if len(heads) != 3 or heads[0] % heads[1] or heads[2] % 2:
        ap.error("--heads wants HQ:HKV:D with HQ a multiple of HKV and D even")
    steps = {dt: Step(args.rows, lo, hi, args.layers, getattr(torch, dt), heads, args.prefill) for dt in dtypes}
    sides = {f"current, {dt} pools": (ops.attend, step) for dt, step in steps.items()}
    if args.baseline:
        old = baseline_op(args.baseline)
        for dt, step in steps.items():
            sides[f"baseline {args.baseline}, {dt} pools"] = (old, step)
            diff = (step.run(ops.attend) - step.run(old)).abs().max().item()
            print(f"largest difference current vs baseline ({dt} pools): {diff:.3g}")
    read, copy = bandwidth()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, (op, step) in sides.items():
            times[name].append(timed(lambda op=op, step=step: step.run(op), args.repeat, clock))
    shape = (f"a {args.prefill}-token prompt" if args.prefill else
             f"{args.rows} rows, contexts {lo}..{hi} ({sum(next(iter(sides.values()))[1].lens)} positions)")
    print(f"{shape}, heads {args.heads}, {args.layers} layers, {args.threads} threads, {args.clock} time; machine read "
          f"{read:.1f} GB/s, copy {copy:.1f} GB/s (read + write)")
    first = statistics.median(next(iter(times.values())))
    for name, ts in times.items():
        t, step = statistics.median(ts), sides[name][1]
        rate = (f"{step.macs() / t / 1e9:.1f} G multiply-adds/s" if args.prefill else
                f"K/V {step.kv_bytes() / 1e6:.0f} MB/step, {step.kv_bytes() / 1e9 / t:.1f} GB/s of K/V")
        print(f"  {name}: {t * 1e3:.1f} ms/step (min {min(ts) * 1e3:.1f}), {rate}, {t / first:.2f}x the first's time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

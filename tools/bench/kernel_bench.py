"""`python -m tools.bench.kernel_bench`: achieved bandwidth of paged decode attention as a fraction of the device's
measured copy bandwidth. Decode attention must read every cached K/V byte once, so
bytes = batch x context x kv_heads x head_dim x 2 (K and V) x bytes per value, and the roofline is the
copy bandwidth (read + write of a large buffer, best of 5: engine.bench.measure, as `python -m engine bench`).
On CUDA it times the Triton kernels; without a GPU it says so and times the torch reference (what the CPU
engine runs) on small sizes."""

from __future__ import annotations

import argparse
import json
import time

import torch

from engine.bench.measure import copy_bandwidth
from kernels import reference_attention as ref_attention
from kernels.kv_quant import make_pool, pool_nbytes

SHAPE = {"kv_heads": 8, "q_heads": 32, "head_dim": 128}  # Llama-3-8B attention shape


def _time(fn, device: torch.device, reps: int | None = None) -> float:
    """Median seconds per call."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3
    times = []
    for _ in range(reps or 5):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def make_decode_case(batch: int, context: int, page_size: int, dtype, device, kv_quant=None, shape=SHAPE,
                     layout: str = "shuffled"):
    """Pools exactly big enough; pages shuffled (a long-running server's) or consecutive per sequence
    (fresh allocations: the torch path then reads views of the pool instead of gathering pages)."""
    Hkv, Hq, D = shape["kv_heads"], shape["q_heads"], shape["head_dim"]
    per_seq = -(-context // page_size)
    num_pages = batch * per_seq
    k = make_pool(kv_quant, num_pages, page_size, Hkv, D, dtype, device)
    v = make_pool(kv_quant, num_pages, page_size, Hkv, D, dtype, device)
    for pool in (k, v):
        tensors = pool.tensors() if kv_quant else [pool]
        for t in tensors:
            if t.dtype.is_floating_point:
                t.normal_().mul_(0.1 if kv_quant else 1.0)
            else:
                t.random_(0, 255)
    order = torch.randperm(num_pages, device=device) if layout == "shuffled" else torch.arange(num_pages, device=device)
    block_table = order.to(torch.int32).view(batch, per_seq)
    kv_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device=device)
    q = torch.randn(batch, Hq, D, dtype=dtype, device=device)
    return q, k, v, block_table, cu_q, kv_lens, D ** -0.5


def kv_bytes(k, v, batch: int, context: int, page_size: int) -> int:
    """Bytes the kernel must read: the sequences' share of the pools (pools are sized exactly)."""
    return (pool_nbytes(k) + pool_nbytes(v)) * context // (-(-context // page_size) * page_size)


def run(batches, contexts, page_sizes, kv_quants, device, dtype, layout: str = "shuffled") -> list[dict]:
    if device.type == "cuda":
        from kernels import triton_ops

        fn = triton_ops.paged_attention
    else:
        fn = ref_attention.paged_attention
    roof = copy_bandwidth(device, 1 << 30 if device.type == "cuda" else 1 << 27)
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}: "
          f"copy bandwidth {roof / 1e9:.1f} GB/s (read + write)")
    print(f"{'quant':>5} {'page':>5} {'batch':>5} {'context':>7} {'time_us':>10} {'GB/s':>8} {'of copy':>8}")
    rows = []
    for kvq in kv_quants:
        for ps in page_sizes:
            for b in batches:
                for ctx in contexts:
                    args = make_decode_case(b, ctx, ps, dtype, device, kvq, layout=layout)
                    t = _time(lambda: fn(*args), device)
                    nbytes = kv_bytes(args[1], args[2], b, ctx, ps)
                    bw = nbytes / t
                    row = dict(kv_quant=kvq or "none", layout=layout, page_size=ps, batch=b, context=ctx, seconds=t,
                               gbps=bw / 1e9, fraction_of_copy=bw / roof, copy_gbps=roof / 1e9)
                    rows.append(row)
                    print(f"{row['kv_quant']:>5} {ps:>5} {b:>5} {ctx:>7} {t * 1e6:>10.1f} {bw / 1e9:>8.1f} "
                          f"{bw / roof * 100:>7.1f}%", flush=True)
                    del args
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--quant", nargs="*", default=None, help="KV formats: none q8 q6 q4 (default: none)")
    ap.add_argument("--layout", choices=["shuffled", "consecutive"], default="shuffled",
                    help="page order of each sequence (default shuffled, the worst case)")
    args = ap.parse_args()
    kvq = [None if q == "none" else q for q in (args.quant or ["none"])]
    if torch.cuda.is_available():
        device, dtype = torch.device("cuda"), torch.float16
        rows = run([1, 4, 16, 64], [512, 2048, 8192, 32768], [16, 256], kvq, device, dtype, args.layout)
    else:
        print("No CUDA GPU present: the Triton kernels are NOT benchmarked. Timing the torch reference "
              "(the CPU engine's path) on small sizes, fp32, with the default model's attention shape.")
        SHAPE.update(kv_heads=3, q_heads=9, head_dim=64)
        rows = run([1, 4, 16], [512, 2048, 8192], [16, 256], kvq, torch.device("cpu"), torch.float32, args.layout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

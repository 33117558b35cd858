"""`python -m tools.bench.dequant_bench`: the Triton dequant-matmul kernels (GGUF blocks as stored, on a CUDA GPU) at
a Llama-3-8B layer's matrix shapes and 1-64 activation rows, as achieved weight bandwidth against the device's
measured copy bandwidth (read + write of a large buffer: engine.bench.measure). At a few rows the kernel must
read every weight byte once and little else, so weight bytes / time is the figure that has a ceiling; the
dense bf16 torch matmul of the same shape is timed beside it (twice to four times the bytes of a K-quant).
Without a GPU it says so and exits."""

from __future__ import annotations

import argparse
import json

import torch

from engine.bench.measure import copy_bandwidth

SHAPES = {"attn_q": (4096, 4096), "ffn_up": (14336, 4096), "ffn_down": (4096, 14336)}  # (N out, K in)
TYPES = {"Q4_K": 12, "Q6_K": 14, "Q8_0": 8, "Q4_0": 2}


def random_blocks(qtype: int, n: int, k: int, device: torch.device) -> torch.Tensor:
    """(n, bytes per row) uint8 blocks with random codes and small finite fp16 scales (the speed of the
    kernel does not depend on the values; NaN scales would only make the outputs useless for a glance)."""
    from kernels.triton_dequant import FORMATS  # (weights, bytes) per block: the kernels' own table

    per, nbytes = FORMATS[qtype]
    raw = torch.randint(0, 256, (n, k // per, nbytes), dtype=torch.uint8, device=device)
    scale = torch.full((n, k // per), 0.01, dtype=torch.float16, device=device).view(torch.uint8).view(n, k // per, 2)
    if qtype == 12:
        raw[..., 0:2], raw[..., 2:4] = scale, scale  # d, dmin at the front
    elif qtype == 14:
        raw[..., 208:210] = scale  # d at the end
    else:
        raw[..., 0:2] = scale
    return raw.view(n, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 4, 16, 64])
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("No CUDA GPU present: the Triton dequant-matmul kernels are NOT benchmarked (they are the CUDA path).")
        return
    import kernels
    from triton.testing import do_bench

    dev = torch.device("cuda")
    roof = copy_bandwidth(dev)
    print(f"device {torch.cuda.get_device_name(dev)}: copy bandwidth {roof / 1e9:.0f} GB/s (read + write)")
    print(f"{'type':>5} {'matrix':>9} {'rows':>4} {'time_us':>9} {'GB/s':>7} {'of copy':>8} {'bf16 us':>8}")
    out = []
    for name, qtype in TYPES.items():
        for mat, (n, k) in SHAPES.items():
            raw = random_blocks(qtype, n, k, dev)
            dense = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02
            for m in args.rows:
                x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
                t = do_bench(lambda: kernels.dequant_matmul(x, raw, qtype, (n, k)), warmup=25, rep=100,
                             return_mode="median") / 1e3
                td = do_bench(lambda: x @ dense.T, warmup=25, rep=100, return_mode="median") / 1e3
                bw = raw.numel() / t
                row = dict(type=name, matrix=mat, n=n, k=k, rows=m, seconds=t, gbps=bw / 1e9,
                           fraction_of_copy=bw / roof, bf16_seconds=td, copy_gbps=roof / 1e9)
                out.append(row)
                print(f"{name:>5} {mat:>9} {m:>4} {t * 1e6:>9.1f} {bw / 1e9:>7.0f} {bw / roof * 100:>7.1f}% "
                      f"{td * 1e6:>8.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

"""The mixture-of-experts benchmark file and its checks: `python -m tools.bench.moe_bench run` (make bench-moe).

The file: Qwen3-30B-A3B's shapes (tools.models._llamacpp_quantized's qwen3-30b-a3b preset: hidden 2048, 128
experts of 768, 8 a token, 32 query and 4 K/V heads of 128, its 151,936-token vocabulary and untied head)
with 12 of its 48 layers, written F16 with random weights and quantized to Q4_K_M by llama.cpp's own
quantizer, built once into the benchmark cache (tools.bench.bench_big's, ~/.cache/pagedeck-bench). "smoke"
is the same pipeline in a minute: 2 layers of 16 experts with 512-wide rows.

gptoss-6L: gpt-oss-20b's shapes (the gpt-oss-20b preset: hidden 2880, 32 experts of 2880, 4 a token, 64
query and 8 K/V heads of 64 with biases and sinks, sliding and full layers alternating, YaRN, o200k_harmony's
201,088-token vocabulary, an untied head) with 6 of its 24 layers, quantized by llama.cpp with MXFP4_MOE as
the published gpt-oss GGUFs are (MXFP4 experts, Q8_0 attention, embedding and head; ~3.9 GB); gptoss-smoke
the same in a minute (2 layers of 16 experts, 512-wide rows, the full vocabulary).

Commands (NAME: qwen3moe-12L, the default, qwen3moe-smoke, gptoss-6L or gptoss-smoke):
  build [NAME]    the file's path, built where missing
  check [NAME]    llama.cpp loads it and its logits agree with ours (tools.models.llamacpp_check)
  layer [NAME]    one sparse layer's time, the MoE kernel against the torch path, at 1 and 8 rows
  run [NAME]      `python -m engine bench --model FILE --weights packed --threads 2 --peer llama.cpp`
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from tools.bench import bench_big

# bench_big's table of cached files takes these as well (preset: llama.cpp's quantizer on it)
FILES = {
    "qwen3moe-12L": dict(preset="qwen3-30b-a3b", layers=12),
    "qwen3moe-smoke": dict(preset="qwen3-30b-a3b", layers=2, hidden_size=512, num_attention_heads=4,
                           num_key_value_heads=2, num_experts=16, experts_per_token=4, moe_intermediate_size=256),
    "gptoss-6L": dict(preset="gpt-oss-20b", layers=6, quant="MXFP4_MOE"),
    "gptoss-smoke": dict(preset="gpt-oss-20b", layers=2, hidden_size=512, num_attention_heads=8,
                         num_key_value_heads=2, num_experts=16, experts_per_token=4, intermediate_size=256,
                         moe_intermediate_size=256, quant="MXFP4_MOE"),
}
bench_big.FILES.update(FILES)


def layer_times(path, rows: tuple[int, ...] = (1, 8), threads: int = 2, repeats: int = 30) -> list[dict]:
    """Per row count: the median time of one sparse layer's block through the kernel and through the torch
    path (alternated call by call in this process), on random hidden states of the layer's width."""
    import torch

    from engine.model import moe_kernel
    from engine.model.model_and_tokenizer import load_model_and_tokenizer

    torch.set_num_threads(threads)
    model, _ = load_model_and_tokenizer(path, weights="packed", device="cpu", dtype=torch.float32)
    block = next(layer.moe for layer in model.layers if layer.moe is not None)
    out = []
    with torch.inference_mode():
        for T in rows:
            h = torch.randn(T, model.config.hidden_size, generator=torch.Generator().manual_seed(T))
            if not moe_kernel.runs(block, h, None):
                raise RuntimeError(f"{path}: the MoE kernel does not run for this layer (CPU kernels not loaded?)")
            kernel, python = [], []
            for i in range(repeats + 3):
                for times, path_of in ((kernel, None), (python, moe_kernel.torch_path)):
                    t = time.perf_counter()
                    if path_of is None:
                        block(h)
                    else:
                        with path_of():
                            block(h)
                    if i >= 3:  # the first calls build the kernel's expert table and warm the caches
                        times.append(time.perf_counter() - t)
            k, p = statistics.median(kernel), statistics.median(python)
            out.append({"rows": T, "kernel_ms": k * 1e3, "torch_ms": p * 1e3, "speedup": p / k})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["build", "check", "layer", "run"])
    ap.add_argument("name", nargs="?", default="qwen3moe-12L", choices=list(FILES))
    ap.add_argument("--repeats", type=int, default=3, help="run: the engine bench's repeats")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    path = bench_big.build(args.name, log=lambda m: print(m, flush=True, file=sys.stderr))
    if args.command == "build":
        print(path)
    elif args.command == "check":
        from tools.models import llamacpp_check

        return llamacpp_check.main([str(path)])
    elif args.command == "layer":
        for r in layer_times(path, threads=args.threads):
            print(f"{r['rows']} rows: kernel {r['kernel_ms']:.2f} ms, torch path {r['torch_ms']:.2f} ms, "
                  f"{r['speedup']:.2f}x")
    else:
        return subprocess.call([sys.executable, "-m", "engine", "bench", "--model", str(path), "--weights", "packed",
                                "--threads", str(args.threads), "--peer", "llama.cpp", "--repeats", str(args.repeats)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

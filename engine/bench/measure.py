"""What every benchmark measures the same way: device synchronisation, the read bandwidth that is the decode
roofline's denominator, the copy bandwidth the attention and dequant benches compare with, and model files read
into the page cache before a timed load (used by `python -m engine bench` and the tools)."""
from __future__ import annotations

import time
from pathlib import Path

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so wall-clock timings cover it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def read_bandwidth(device: torch.device, nbytes: int | None = None, rounds: int = 7) -> float:
    """Bytes/s of reading a large tensor once (a sum over it, on the threads torch has), best of `rounds`: the
    decode roofline's denominator, since a decode step reads its weights and writes next to nothing. A copy
    counts a write beside each read, and its first touches of the destination fault pages in."""
    nbytes = nbytes or (1 << 30 if device.type == "cuda" else 512 << 20)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(rounds):
        sync(device)
        t = time.perf_counter()
        src.sum()
        sync(device)
        best = min(best, time.perf_counter() - t)
    del src
    return nbytes / best


def copy_bandwidth(device: torch.device, nbytes: int | None = None) -> float:
    """Bytes/s of a large tensor copy (read + write counted), best of 5: the memory roofline's denominator."""
    nbytes = nbytes or (1 << 30 if device.type == "cuda" else 256 << 20)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t)
    del src, dst
    return 2 * nbytes / best


def read_through(paths: list[Path], chunk: int = 16 << 20) -> int:
    """Read each file once, so it is in the OS page cache before any engine's timed load: the engine loading
    second would otherwise find the file cached by the first, and after a long run (or on a fresh VM) the
    first load reads from disk (a 1.3 GB file: 4.4 s against 1.1 s cached, here). Returns the bytes read."""
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(chunk)
            while (n := f.readinto(buf)):
                total += n
    return total

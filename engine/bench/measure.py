"""What every benchmark measures the same way: device synchronisation and the copy bandwidth that is the
memory roofline's denominator (used by `python -m engine bench` and the tools)."""
from __future__ import annotations

import time

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so wall-clock timings cover it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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

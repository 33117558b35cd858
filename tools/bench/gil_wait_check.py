"""How long Qt-thread work waits while the generator streams: `python -m tools.bench.gil_wait_check [--rounds 3]`.

Eight replies stream on the app's EngineService (the embedded default model) while the Qt thread times each
dashboard push + repaint: its wall time against its own CPU time (time.thread_time); the difference is
waiting, for the GIL or for a core. Rounds alternate CPython's default switch interval (5 ms) with the
app's (1 ms, app/local/gil_share.py), so a shared machine's load falls on both alike.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time


async def _round(service, dock, interval: float, seconds: float) -> dict:
    from engine import DynamicJobAsync

    sys.setswitchinterval(interval)
    gen, tok = service.generator, service.tokenizer
    ids = tok.encode("Write a long story about a lighthouse keeper and the sea.")
    jobs = [DynamicJobAsync(gen, input_ids=ids, max_new_tokens=900, seed=i, stop_conditions=[]) for i in range(8)]
    tokens = [0]

    async def drain(job):
        async for result in job:
            tokens[0] += len(result.get("token_ids", ()) if hasattr(result.get("token_ids", ()), "__len__") else ())

    tasks = [asyncio.ensure_future(drain(j)) for j in jobs]
    await asyncio.sleep(1.0)  # prefills done: steady decoding
    waits, walls = [], []
    tokens[0] = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        snap = service.snapshot()
        w0, c0 = time.perf_counter(), time.thread_time()
        dock.push(snap)
        dock.repaint()  # paints now, in this call (processEvents would re-enter the loop)
        wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
        walls.append(wall)
        waits.append(max(0.0, wall - cpu))
        await asyncio.sleep(0.1)
    streamed = tokens[0]
    for j in jobs:
        await j.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    waits.sort()
    walls.sort()
    return {"interval_ms": interval * 1000, "n": len(walls), "tokens_streamed": streamed, "wall_median_ms": round(statistics.median(walls) * 1000, 2),
            "wall_p90_ms": round(walls[int(0.9 * (len(walls) - 1))] * 1000, 2),
            "wait_median_ms": round(statistics.median(waits) * 1000, 2),
            "wait_p90_ms": round(waits[int(0.9 * (len(waits) - 1))] * 1000, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args(argv)
    from PySide6.QtWidgets import QApplication

    from app.local.engine_service import EngineService
    from app.panels.dashboard import DashboardDock
    from app.window.event_loop import QtEventLoop

    app = QApplication.instance() or QApplication([])
    loop = QtEventLoop(app)
    asyncio.set_event_loop(loop)

    async def body():
        service = EngineService()
        assert await service.load({"path": None, "cache_tokens": 8 * 1024})
        dock = DashboardDock()
        dock.resize(520, 900)
        dock.show()
        for _ in range(args.rounds):
            for interval in (0.005, 0.001):
                print(await _round(service, dock, interval, args.seconds), flush=True)
        await service.close()

    loop.run_until_complete(body())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

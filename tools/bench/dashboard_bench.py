"""The dashboard's cost per metrics snapshot: `python -m tools.bench.dashboard_bench [--pages 1024 16384]`.

The app pushes a snapshot about ten times a second while chats stream; this feeds the real DashboardDock a
simulated run (tools.simulated_workload) and times push() and the repaint it causes.
"""
from __future__ import annotations

import argparse
import time
from typing import Sequence

import numpy as np

from app.panels.dashboard import DashboardDock
from tools.simulated_workload import SimulatedWorkload


def bench(pages: Sequence[int] = (1024, 16384), snapshots: int = 200) -> dict[int, dict[str, float]]:
    """Cost per snapshot of push() and of the repaint it causes (the processEvents() that paints it).

    CPU time of this thread (time.process_time), so other processes on a shared machine don't count.
    """
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    results = {}
    for n in pages:
        dock = DashboardDock()
        dock.resize(520, 900)
        dock.show()
        work = SimulatedWorkload(pages_total=n, seed=1)
        snaps = [work.step(0.1) for _ in range(snapshots)]
        push, paint = [], []
        for snap in snaps:
            t0 = time.process_time()
            dock.push(snap)
            t1 = time.process_time()
            app.processEvents()
            push.append(t1 - t0)
            paint.append(time.process_time() - t1)
        push_ms, paint_ms = np.array(push[10:]) * 1e3, np.array(paint[10:]) * 1e3
        total = push_ms + paint_ms
        results[n] = {"push_ms": float(push_ms.mean()), "paint_ms": float(paint_ms.mean()),
                      "total_ms": float(total.mean()), "p99_ms": float(np.percentile(total, 99))}
        dock.close()
        dock.deleteLater()
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Measure the dashboard's cost per metrics snapshot.")
    parser.add_argument("--pages", type=int, nargs="+", default=[1024, 16384])
    parser.add_argument("--snapshots", type=int, default=200)
    args = parser.parse_args(argv)
    for n, r in bench(args.pages, args.snapshots).items():
        print(f"{n:>6} pages: push {r['push_ms']:.2f} ms + paint {r['paint_ms']:.2f} ms = {r['total_ms']:.2f} ms "
              f"per snapshot (p99 {r['p99_ms']:.2f} ms)")


if __name__ == "__main__":
    main()

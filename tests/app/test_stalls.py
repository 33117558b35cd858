"""Main-thread stalls while 8 chats stream: a 10 ms QTimer probe records how late each tick fires.

As a test (the tiny random model: many tokens per second, the UI side under stress) it bounds the stalls
that are the app's own: each tick's lateness less the time the main thread spent waiting for a CPU
meanwhile (runnable but not running: /proc/self/task/<tid>/schedstat), which is the machine's load, not the
app's doing. Work on the loop, a blocking call on it or the GIL held by another thread still counts. The
bounds: p99 under two 60 Hz frames and no tick later than OWN_MAX_MS (a 100 ms block on the loop is later).
As a script it reports the figures for the real default model:

    QT_QPA_PLATFORM=offscreen .venv/bin/python tests/app/test_stalls.py [--model PATH] [--seconds 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.app.support import loop, run, tiny_model  # noqa: E402,F401

PROBE_MS = 10
FRAME_MS = 1000 / 60
OWN_P99_MS = 2 * FRAME_MS
OWN_MAX_MS = 90.0  # lateness past the 10 ms period: a tick 100 ms after the last one is 90 ms late
PROMPTS = [
    "Write a Python function that parses ISO dates, with tests.",
    "Explain how a paged KV cache works, with a table.",
    "List ten facts about octopuses in Markdown bullet points.",
    "Write a haiku sequence about autumn.",
    "Compare SQLite WAL mode and rollback journals.",
    "Show a Rust example of borrowing rules, in a code block.",
    "Plan a three-day trip to Lisbon.",
    "Explain continuous batching to a new engineer.",
]


def cpu_wait_s(tid: int) -> float:
    """Seconds thread `tid` of this process has spent runnable but waiting for a CPU (the second field of
    /proc/self/task/<tid>/schedstat, in ns); 0 where the kernel does not keep it, so every stall counts."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


async def measure(window, seconds: float, max_new_tokens: int, min_tokens: int = 0) -> dict:
    """Start 8 chats (4 tiled on screen, 4 streaming in the background) and, once all 8 stream, probe the UI
    thread for `seconds`, and longer (up to ten times as long) until the chats have streamed `min_tokens`
    between them: on a crowded machine a few seconds may see almost no tokens, so almost nothing to show.
    (The 8 prompts' admission before that is reported as `all_streaming_s`, not probed.)"""
    from PySide6.QtCore import Qt, QTimer

    from app.core.store import ChatSettings

    panes = [window.new_chat(f"chat {i + 1}") for i in range(8)]
    window.chats.show_side_by_side(panes[:4])
    for i, p in enumerate(panes):
        p.session.set_settings(ChatSettings(max_new_tokens=max_new_tokens, seed=i))
    lateness: list[float] = []
    own: list[float] = []  # lateness less the main thread's wait for a CPU over the same gap
    main = threading.get_native_id()
    last = [time.perf_counter(), cpu_wait_s(main)]

    def tick() -> None:
        now, waited = time.perf_counter(), cpu_wait_s(main)
        late = max(0.0, now - last[0] - PROBE_MS / 1000)
        lateness.append(late)
        own.append(max(0.0, late - (waited - last[1])))
        last[:] = [now, waited]

    probe = QTimer()
    probe.setTimerType(Qt.TimerType.PreciseTimer)
    probe.setInterval(PROBE_MS)
    probe.timeout.connect(tick)
    def tokens(p) -> int:
        return (p.session.live(p.session.messages[-1].id) or (None, p.session.messages[-1].stats))[1].new_tokens

    def streamed() -> int:
        return sum(tokens(p) for p in panes)

    sent = time.perf_counter()
    for p, prompt in zip(panes, PROMPTS):
        p.send(prompt)
    while not all(tokens(p) > 0 for p in panes) and time.perf_counter() - sent < 60:
        await asyncio.sleep(0.01)
    start = time.perf_counter()
    last[:] = [start, cpu_wait_s(main)]
    probe.start()
    peak = 0

    while any(p.session.running for p in panes) and time.perf_counter() - start < 10 * seconds and \
            (time.perf_counter() - start < seconds or streamed() < min_tokens):
        peak = max(peak, window.service.snapshot()["active_jobs"])
        await asyncio.sleep(0.05)
    probe.stop()
    elapsed = time.perf_counter() - start
    tokens = streamed()
    for p in panes:
        await p.session.stop()
    ordered, own = sorted(lateness) or [0.0], sorted(own) or [0.0]
    pick = lambda values, q: values[min(len(values) - 1, int(q * len(values)))] * 1000  # noqa: E731
    return {
        "chats": len(panes), "all_streaming_s": round(start - sent, 2), "seconds": round(elapsed, 1),
        "probe_ticks": len(lateness),
        "stall_p50_ms": round(pick(ordered, 0.50), 1), "stall_p99_ms": round(pick(ordered, 0.99), 1),
        "stall_max_ms": round(ordered[-1] * 1000, 1),
        "own_stall_p99_ms": round(pick(own, 0.99), 1), "own_stall_max_ms": round(own[-1] * 1000, 1),
        "peak_active_jobs": peak, "tokens": tokens, "aggregate_tok_s": round(tokens / elapsed, 1),
    }


def test_stalls_while_eight_chats_stream(qtbot, loop, tmp_path, tiny_model, capsys):
    from app.core.store import Store
    from app.window.main_window import MainWindow
    from tests.app.support import loaded_service

    async def body():
        store = Store.open(tmp_path / "data")
        window = MainWindow(store, await loaded_service(tiny_model, cache_tokens=8 * 512))
        qtbot.addWidget(window)
        window.resize(1600, 900)
        window.show()
        result = await measure(window, seconds=6.0, max_new_tokens=400, min_tokens=8 * 8)
        await window.shutdown()
        return result

    result = run(loop, body(), 200)
    with capsys.disabled():
        print(f"\nmain-thread stalls, 8 chats streaming (tiny model): {json.dumps(result)}")
    assert result["peak_active_jobs"] == 8 and result["tokens"] >= 8 * 8 and result["probe_ticks"] > 10
    assert result["own_stall_p99_ms"] < OWN_P99_MS and result["own_stall_max_ms"] < OWN_MAX_MS, result


def main() -> int:
    from PySide6.QtWidgets import QApplication

    from app.window.event_loop import QtEventLoop
    from app.window.main_window import MainWindow

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder or .gguf (default: the embedded SmolLM2)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-new-tokens", type=int, default=1000)
    ap.add_argument("--data-dir", default=None, help="default: a temporary folder")
    args = ap.parse_args()
    import tempfile

    app = QApplication.instance() or QApplication(sys.argv[:1])
    lp = QtEventLoop(app)
    asyncio.set_event_loop(lp)

    async def body() -> dict:
        window = MainWindow(data_dir=args.data_dir or tempfile.mkdtemp(prefix="pagedeck-stalls-"))
        window.resize(1600, 900)
        window.show()
        if not await window.loader.load_model({"path": args.model, "cache_tokens": 8 * (args.max_new_tokens + 256)}):
            raise SystemExit(window.status.last_error)
        result = await measure(window, args.seconds, args.max_new_tokens)
        result["model"] = window.service.info["name"]
        await window.shutdown()
        return result

    with lp:
        print(json.dumps(lp.run_until_complete(body())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

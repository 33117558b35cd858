"""Main-thread stalls while 8 chats stream: a 10 ms QTimer probe records how late each tick fires.

Reports, never asserts, timing (the machine is shared). As a test it uses the tiny random model (many
tokens per second: the UI side under stress); as a script it measures the real default model:

    QT_QPA_PLATFORM=offscreen .venv/bin/python tests/app/test_stalls.py [--model PATH] [--seconds 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.app.support import loop, run, tiny_model  # noqa: E402,F401

PROBE_MS = 10
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


async def measure(window, seconds: float, max_new_tokens: int) -> dict:
    """Start 8 chats (4 tiled on screen, 4 streaming in the background) and probe the UI thread."""
    from PySide6.QtCore import Qt, QTimer

    from app.core.store import ChatSettings

    panes = [window.new_chat(f"chat {i + 1}") for i in range(8)]
    window.chats.show_side_by_side(panes[:4])
    for i, p in enumerate(panes):
        p.session.set_settings(ChatSettings(max_new_tokens=max_new_tokens, seed=i))
    lateness: list[float] = []
    last = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        lateness.append(max(0.0, now - last[0] - PROBE_MS / 1000))
        last[0] = now

    probe = QTimer()
    probe.setTimerType(Qt.TimerType.PreciseTimer)
    probe.setInterval(PROBE_MS)
    probe.timeout.connect(tick)
    for p, prompt in zip(panes, PROMPTS):
        p.send(prompt)
    start = time.perf_counter()
    last[0] = start
    probe.start()
    peak = 0
    while time.perf_counter() - start < seconds and any(p.session.running for p in panes):
        peak = max(peak, window.service.snapshot()["active_jobs"])
        await asyncio.sleep(0.05)
    probe.stop()
    elapsed = time.perf_counter() - start
    tokens = sum((p.session.live(p.session.messages[-1].id) or (None, p.session.messages[-1].stats))[1].new_tokens
                 for p in panes)
    for p in panes:
        await p.session.stop()
    ordered = sorted(lateness) or [0.0]
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {
        "chats": len(panes), "seconds": round(elapsed, 1), "probe_ticks": len(lateness),
        "stall_p50_ms": round(pick(0.50), 1), "stall_p99_ms": round(pick(0.99), 1), "stall_max_ms": round(ordered[-1] * 1000, 1),
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
        result = await measure(window, seconds=6.0, max_new_tokens=400)
        await window.shutdown()
        return result

    result = run(loop, body(), 200)
    with capsys.disabled():
        print(f"\nmain-thread stalls, 8 chats streaming (tiny model): {json.dumps(result)}")
    assert result["peak_active_jobs"] == 8 and result["tokens"] > 8 and result["probe_ticks"] > 10


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

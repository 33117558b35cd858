"""Screenshots for the README: `python -m app.screenshots OUTDIR [--dashboard-only]`.

The full run opens the real main window on a scratch history folder, starts four chats streaming (three
tiled side by side) through the one batched generator and grabs PNGs of the window and the dashboard
while they stream. dashboard.png (always written, and all that `--dashboard-only` writes) is the dashboard
fed a simulated but plausible snapshot sequence (`SimulatedWorkload`, also used by the dashboard
benchmark): it needs no model and is deterministic.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Sequence

import numpy as np

CHATS = (
    ("chat-1", "Rust borrow checker"), ("chat-2", "Trip to Lisbon"), ("chat-3", "SQL window functions"),
    ("chat-4", "Poem about autumn"), ("chat-5", "Explain KV caches"), ("chat-6", "Unit tests for parser"),
)
PROMPTS = (
    "Explain, with a short code example, why Rust's borrow checker rejects two mutable references.",
    "Plan a relaxed three-day trip to Lisbon with food recommendations for each day.",
    "Show how SQL window functions compute a running total, then a rank per group.",
    "Write a short poem about autumn leaves in the style of a haiku sequence.",
)


class SimulatedWorkload:
    """A plausible generator serving several chats, as metrics()-shaped dicts; no engine or model needed.

    Jobs share a system-prompt prefix page (hash-shared pages), grow page by page while decoding, leave
    their pages cached when done, and a LoRA swap mid-run defers new requests until running jobs drain.
    """

    def __init__(self, pages_total: int = 1024, page_size: int = 256, seed: int = 0, max_batch: int = 8,
                 arrival_rate: float = 0.6, swap_at: float | None = 38.0, speculative: bool = True) -> None:
        if pages_total < 8:
            raise ValueError(f"SimulatedWorkload needs at least 8 pages, got {pages_total}")
        self.rng = np.random.default_rng(seed)
        self.pages_total, self.page_size, self.max_batch = pages_total, page_size, max_batch
        self.arrival_rate, self.swap_at, self.speculative = arrival_rate, swap_at, speculative
        self.states = np.full(pages_total, -2, np.int64)
        self.holders: list[list[int]] = [[] for _ in range(pages_total)]
        self.free: deque[int] = deque(range(pages_total))
        self.cached: deque[int] = deque()  # LRU: oldest first
        self.prefix: list[int] = []  # the shared system-prompt page(s)
        self.jobs: dict[int, dict] = {}
        self.pending: deque[dict] = deque()
        self.deferred: deque[dict] = deque()
        self.serial = 0
        self.elapsed = 0.0
        self.start_time = 1000.0
        self.loras: list[str] = []
        self.swapping = False
        self.c = dict(tokens=0, steps=0, drafted=0, accepted=0, prefix_hits=0)
        self.per_position = [0, 0, 0, 0]
        self.last_prefill = self.last_decode = self.last_batch = self.last_busy = 0

    # ------------------------------------------------------------------------------- page table
    def _take_page(self) -> int | None:
        if self.free:
            return self.free.popleft()
        while self.cached:
            page = self.cached.popleft()
            if page in self.prefix:
                self.prefix = []
            return page
        return None

    def _hold(self, page: int, serial: int) -> None:
        self.holders[page].append(serial)
        self.states[page] = self.holders[page][0]

    def _release(self, job: dict) -> None:
        for page in job["pages"]:
            self.holders[page].remove(job["serial"])
            if self.holders[page]:
                self.states[page] = self.holders[page][0]
            else:
                self.states[page] = -1
                self.cached.append(page)

    # ------------------------------------------------------------------------------- scheduling
    def _arrive(self) -> None:
        chat, _ = CHATS[int(self.rng.integers(len(CHATS)))]
        job = dict(serial=self.serial, chat=chat, prompt=int(self.rng.integers(400, 3000)),
                   target=int(self.rng.integers(150, 700)), done=0, prefilled=0, pages=[])
        if self.jobs and self.rng.random() < 0.35:  # "regenerate" on a chat that is still streaming
            source = self.jobs[int(self.rng.choice(list(self.jobs)))]
            job.update(chat=source["chat"], prompt=source["prompt"], branch_of=source["serial"])
        self.serial += 1
        (self.deferred if self.swapping else self.pending).append(job)

    def _admit(self, job: dict) -> bool:
        need = math.ceil(job["prompt"] / self.page_size)
        if len(self.free) + len(self.cached) < need + 1:
            return False
        branch = job.get("branch_of")
        if branch in self.jobs:  # regenerate / branch: the full prompt pages are shared by hash
            source = self.jobs[branch]
            shared = source["pages"][:source["prompt"] // self.page_size]
            for p in shared:
                self._hold(p, job["serial"])
            job["pages"] += shared
            job["prefilled"] = len(shared) * self.page_size
            self.c["prefix_hits"] += job["prefilled"]
        elif self.prefix and all(self.holders[p] or p in self.cached for p in self.prefix):
            for p in self.prefix:
                if p in self.cached:
                    self.cached.remove(p)
                self._hold(p, job["serial"])
            job["pages"] += self.prefix
            job["prefilled"] = len(self.prefix) * self.page_size
            self.c["prefix_hits"] += job["prefilled"]
        while len(job["pages"]) < need:
            page = self._take_page()
            self._hold(page, job["serial"])
            job["pages"].append(page)
        if not self.prefix:
            self.prefix = job["pages"][:1]
        self.jobs[job["serial"]] = job
        return True

    def step(self, dt: float = 0.1) -> dict:
        """Advance `dt` seconds and return the snapshot a metrics() call would give then."""
        self.elapsed += dt
        for _ in range(int(self.rng.poisson(self.arrival_rate * dt))):
            self._arrive()
        if self.swap_at is not None and not self.swapping and self.elapsed >= self.swap_at and not self.loras:
            self.swapping = True
        if self.swapping and not self.jobs:
            self.swapping, self.loras = False, ["pirate-style"]
            self.pending.extend(self.deferred)
            self.deferred.clear()
        while self.pending and not self.swapping and len(self.jobs) < self.max_batch and self._admit(self.pending[0]):
            self.pending.popleft()
        prefill = decode = 0
        per_job_rate = 70.0 / (1.0 + 0.12 * len(self.jobs))
        for job in list(self.jobs.values()):
            if job["prefilled"] < job["prompt"]:
                chunk = min(job["prompt"] - job["prefilled"], int(4000 * dt))
                job["prefilled"] += chunk
                prefill += chunk
                continue
            new = int(self.rng.poisson(per_job_rate * dt * (1.6 if self.speculative else 1.0)))
            job["done"] += new
            decode += new
            if self.speculative and new:
                drafted = 4 * max(1, new // 2)
                accepted = min(drafted, int(self.rng.binomial(drafted, 0.62)))
                self.c["drafted"] += drafted
                self.c["accepted"] += accepted
                for i in range(min(4, accepted)):
                    self.per_position[i] += 1
            while (job["prompt"] + job["done"]) > len(job["pages"]) * self.page_size:
                page = self._take_page()
                if page is None:
                    break
                self._hold(page, job["serial"])
                job["pages"].append(page)
            if job["done"] >= job["target"]:
                self._release(job)
                del self.jobs[job["serial"]]
        self.c["tokens"] += decode
        self.c["steps"] += int(round(dt / 0.02))
        self.last_prefill, self.last_decode, self.last_batch = prefill, decode, len(self.jobs)
        self.last_busy = min(len(self.jobs), 16) if len(self.jobs) >= 3 else 0
        return self.snapshot()

    def snapshot(self) -> dict:
        free, cached = int(np.count_nonzero(self.states == -2)), int(np.count_nonzero(self.states == -1))
        return {
            "pages_total": self.pages_total, "pages_referenced": self.pages_total - free - cached,
            "pages_cached": cached, "pages_free": free, "page_states": self.states.tolist(),
            "page_shared": [len(h) > 1 for h in self.holders], "page_size": self.page_size,
            "page_owner_identifiers": {s: j["chat"] for s, j in self.jobs.items()},
            "active_jobs": len(self.jobs), "pending_jobs": len(self.pending), "deferred_jobs": len(self.deferred),
            "batch_size": self.last_batch, "prefill_tokens_step": self.last_prefill,
            "decode_tokens_step": self.last_decode, "tokens_generated_total": self.c["tokens"],
            "prefill_tokens_total": 0, "steps_total": self.c["steps"], "time_total_s": self.elapsed,
            "drafted_tokens_total": self.c["drafted"], "accepted_tokens_total": self.c["accepted"],
            "accepted_per_position": list(self.per_position), "sampling_threads_busy": self.last_busy,
            "step_host_overhead_s": 0.0,
            "sampling_threads_max": 16, "prefix_hit_tokens_total": self.c["prefix_hits"], "loras": list(self.loras),
            "snapshot_time": self.start_time + self.elapsed,
        }


def save_dashboard_screenshot(path: Path, seconds: float = 75.0, pages_total: int = 512,
                              size: tuple[int, int] = (560, 980)) -> Path:
    """Feed the dashboard a simulated run and save it as PNG (needs a QApplication)."""
    from PySide6.QtWidgets import QApplication

    from app.dashboard import DashboardDock

    app = QApplication.instance() or QApplication([])
    dock = DashboardDock()
    dock.set_identifier_labels(dict(CHATS))
    dock.resize(*size)
    dock.show()
    work = SimulatedWorkload(pages_total=pages_total, seed=7)
    for _ in range(int(seconds / 0.1)):
        dock.push(work.step(0.1))
    for _ in range(300):  # end on a busy moment: a screenshot of an idle cache shows little
        if dock.snapshot["active_jobs"] >= 6:
            break
        dock.push(work.step(0.1))
    shared = [i for i, s in enumerate(dock.snapshot["page_shared"]) if s]
    if shared:  # what hovering a shared page shows
        dock.page_map.show_page_info(shared[-1])
    app.processEvents()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not dock.grab().save(str(path)):
        raise OSError(f"could not write screenshot {path}")
    dock.close()
    return path


def _reply_state(session) -> tuple[str, str | None]:
    """(text so far, error) of a chat's newest reply, live while it streams."""
    reply = session.messages[-1]
    live = session.live(reply.id)
    if live is not None:
        return live[0], live[1].error
    return reply.content, reply.stats.error if reply.stats is not None else None


async def _until_streamed(sessions: list, min_chars: int, timeout: float) -> None:
    """Wait until every reply shows `min_chars` of text (or one ends, or time runs out); fail on errors.

    Waiting on text rather than a fixed delay keeps the shots mid-stream on a fast GPU and a slow CPU alike.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        states = [_reply_state(s) for s in sessions]
        errors = [e for _, e in states if e]
        if errors:
            raise SystemExit(f"a chat failed while streaming, no screenshot taken: {errors[0]}")
        if any(not s.running for s in sessions) or all(len(t) >= min_chars for t, _ in states):
            return
        await asyncio.sleep(0.1)


async def _stream_main_window(outdir: Path, seconds: float, data_dir: Path) -> list[Path]:
    """Open MainWindow on a scratch history, stream one chat per prompt side by side, grab PNGs mid-stream."""
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    window = MainWindow(data_dir=data_dir)
    window.resize(1900, 1050)
    window.show()
    try:
        if not await window.ready():  # the model loads off the UI thread
            raise SystemExit(f"model did not load: {window.last_error}")
        panes = [window.new_chat(title) for _, title in CHATS[:len(PROMPTS)]]
        window.show_side_by_side(panes[:3])
        if window.dashboard is not None:
            window.dashboard.set_identifier_labels({p.session.chat_id: p.session.chat.title for p in panes})
        for pane, prompt in zip(panes, PROMPTS):  # the 4th streams in the background: the batch holds all four
            pane.prompt.setPlainText(prompt)
            pane.submit()
        sessions = [p.session for p in panes]
        saved = []
        for i, min_chars in enumerate((120, 400)):
            await _until_streamed(sessions, min_chars, seconds / 2)
            QApplication.processEvents()
            shots = [(f"app-streaming-{i + 1}.png", window)]
            if window.dashboard is not None:
                shots.append((f"dashboard-live-{i + 1}.png", window.dashboard))
            for name, widget in shots:
                path = outdir / name
                if not widget.grab().save(str(path)):
                    raise OSError(f"could not write screenshot {path}")
                saved.append(path)
    finally:  # stop the generator's worker thread even when a shot failed
        await window.shutdown()
        window.close()
    return saved


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save README screenshots of pagedeck.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--dashboard-only", action="store_true",
                        help="only the dashboard, fed by a simulated workload (no model needed)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="the longest to let the chats stream before the screenshots are taken")
    args = parser.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    saved = [save_dashboard_screenshot(args.outdir / "dashboard.png")]
    if not args.dashboard_only:
        import qasync

        loop = qasync.QEventLoop(app)
        asyncio.set_event_loop(loop)
        with tempfile.TemporaryDirectory(prefix="pagedeck-shots-") as data_dir, loop:
            saved += loop.run_until_complete(_stream_main_window(args.outdir, args.seconds, Path(data_dir)))
    for path in saved:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

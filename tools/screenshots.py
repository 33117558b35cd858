"""Screenshots for the README: `python -m tools.screenshots OUTDIR [--dashboard-only | --lora-only | --batch-only]
[--size WxH]`.

The full run opens the real main window (sized to fill a WxH screen, e.g. under `xvfb-run -s
"-screen 0 1366x768x24"`) on a scratch history folder, starts four chats streaming (three
tiled side by side) through the one batched generator and grabs PNGs of the window and the dashboard
while they stream. dashboard.png (always written, and all that `--dashboard-only` writes) is the dashboard
fed a simulated but plausible snapshot sequence (tools.simulated_workload, also used by the dashboard
benchmark): it needs no model and is deterministic. app-lora-chats.png (`--lora-only` writes only it) is
two chats on different demo adapters (pirate, bullets) streaming at once, the page map coloured by adapter.
batch-run.png (`--batch-only`) is the Batch tab running a template over twelve product reviews.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from tools.simulated_workload import CHATS, SimulatedWorkload

PROMPTS = (
    "Explain, with a short code example, why Rust's borrow checker rejects two mutable references.",
    "Plan a relaxed three-day trip to Lisbon with food recommendations for each day.",
    "Show how SQL window functions compute a running total, then a rank per group.",
    "Write a short poem about autumn leaves in the style of a haiku sequence.",
)


def save_dashboard_screenshot(path: Path, seconds: float = 75.0, pages_total: int = 512,
                              size: tuple[int, int] = (560, 980)) -> Path:
    """Feed the dashboard a simulated run and save it as PNG (needs a QApplication)."""
    from PySide6.QtWidgets import QApplication

    from app.panels.dashboard import DashboardDock

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


async def _stream_main_window(outdir: Path, seconds: float, data_dir: Path, size: tuple[int, int],
                              theme: str = "light") -> list[Path]:
    """Open MainWindow on a scratch history, stream one chat per prompt side by side, grab PNGs mid-stream."""
    from app.window.main_window import MainWindow

    window = MainWindow(data_dir=data_dir)
    window.theme.set_mode(theme)  # written to the scratch preferences file (PAGEDECK_SETTINGS, set in main)
    window.show()
    window.resize(*size)  # as if maximized on a WxH screen (Xvfb has no window manager to do it)
    try:
        if not await window.loader.ready():  # the model loads off the UI thread
            raise SystemExit(f"model did not load: {window.status.last_error}")
        panes = [window.new_chat(title) for _, title in CHATS[:len(PROMPTS)]]
        window.chats.show_side_by_side(panes[:3])
        window.dashboard.set_identifier_labels({p.session.chat_id: p.session.chat.title for p in panes})
        for pane, prompt in zip(panes, PROMPTS):  # the 4th streams in the background: the batch holds all four
            pane.prompt.setPlainText(prompt)
            pane.submit()
        sessions = [p.session for p in panes]
        saved = []
        for i, min_chars in enumerate((120, 400)):
            await _until_streamed(sessions, min_chars, seconds / 2)
            await asyncio.sleep(0.1)  # let the loop paint; processEvents() here would re-enter the running tasks
            tag = f"{size[0]}x{size[1]}{'-dark' if theme == 'dark' else ''}-{i + 1}"
            shots = [(f"app-streaming-{tag}.png", window), (f"dashboard-live-{tag}.png", window.dashboard)]
            for name, widget in shots:
                path = outdir / name
                if not widget.grab().save(str(path)):
                    raise OSError(f"could not write screenshot {path}")
                saved.append(path)
    finally:  # stop the generator's worker thread even when a shot failed
        await window.shutdown()
        window.close()
    return saved


async def _stream_lora_chats(outdir: Path, seconds: float, data_dir: Path) -> list[Path]:
    """Two chats, each its own demo adapter (per-job LoRA), streaming side by side in one batch."""
    from dataclasses import replace

    from app.window.main_window import MainWindow
    from engine.contract import demo_adapters_folder

    window = MainWindow(data_dir=data_dir)
    window.resize(1900, 1050)
    window.show()
    try:
        if not await window.loader.ready():
            raise SystemExit(f"model did not load: {window.status.last_error}")
        folder = demo_adapters_folder()
        chats = (("pirate", "Tell me about your favourite food."), ("bullets", "Tell me about your favourite food."))
        for name, _ in chats:
            if not await window.service.load_adapter(folder / name):
                raise SystemExit(f"could not load the demo adapter {name}: {window.status.last_error}")
        panes = []
        for name, prompt in chats:
            pane = window.new_chat(f"{name} adapter")
            pane.session.set_settings(replace(pane.session.settings, loras=((name, 1.0),)))
            panes.append((pane, prompt))
        window.chats.show_side_by_side([p for p, _ in panes])
        window.dashboard.page_map.by_adapter.setChecked(True)
        for pane, prompt in panes:
            pane.prompt.setPlainText(prompt)
            pane.submit()
        await _until_streamed([p.session for p, _ in panes], 200, seconds)
        await asyncio.sleep(0.1)  # let the loop paint; processEvents() here would re-enter the running tasks
        path = outdir / "app-lora-chats.png"
        if not window.grab().save(str(path)):
            raise OSError(f"could not write screenshot {path}")
        return [path]
    finally:
        await window.shutdown()
        window.close()


REVIEWS = (
    ("kettle", "Boils fast but the lid rattles."), ("phone", "Battery lasts two days; the screen is dim outdoors."),
    ("shoes", "Comfortable, though they ran half a size small."), ("blender", "Loud, and it leaks at the base."),
    ("tent", "Dry through a night of heavy rain."), ("headphones", "Warm sound; the app keeps disconnecting."),
    ("desk lamp", "Bright, and the arm stays put."), ("coffee grinder", "Consistent grind but messy."),
    ("backpack", "The straps frayed after a month."), ("air fryer", "Cooks evenly and cleans easily."),
    ("keyboard", "Feels great, the keys are a bit loud."), ("umbrella", "Flipped inside out in light wind."),
)


async def _batch_run(outdir: Path, seconds: float, data_dir: Path) -> list[Path]:
    """The Batch tab mid-run: twelve product reviews through one template, rows filling in as they finish."""
    import csv

    from PySide6.QtCore import Qt

    from app.window.main_window import MainWindow

    inputs = data_dir / "reviews.csv"
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(inputs, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["product", "review"])
        w.writerows(REVIEWS)
    window = MainWindow(data_dir=data_dir)
    window.resize(1900, 1050)
    window.show()
    try:
        if not await window.loader.ready():
            raise SystemExit(f"model did not load: {window.status.last_error}")
        dock = window.dock("Batch")
        dock.raise_()
        window.resizeDocks([dock], [1000], Qt.Orientation.Horizontal)
        view = window.batch_view
        view.file.setText(str(inputs))
        view.template.setText("Summarise this {product} review in five words: {review}")
        view.system.setText("You are a concise product analyst.")
        view.max_tokens.setValue(24)
        view.start_btn.click()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while view.progress.value() < 7 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)  # let the loop paint; processEvents() here would re-enter the running tasks
        path = outdir / "batch-run.png"
        if not window.grab().save(str(path)):
            raise OSError(f"could not write screenshot {path}")
        return [path]
    finally:
        await window.shutdown()
        window.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save README screenshots of pagedeck.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--dashboard-only", action="store_true",
                        help="only the dashboard, fed by a simulated workload (no model needed)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="the longest to let the chats stream before the screenshots are taken")
    parser.add_argument("--lora-only", action="store_true",
                        help="only app-lora-chats.png: two chats on different adapters (needs the model)")
    parser.add_argument("--batch-only", action="store_true",
                        help="only batch-run.png: the Batch tab mid-run (needs the model)")
    parser.add_argument("--size", default="1920x1080", help="window size WxH (the screen it is shown for)")
    parser.add_argument("--theme", choices=("light", "dark"), default="light",
                        help="the app's theme for the main-window shots (dark ones are named ...-dark-N.png)")
    args = parser.parse_args(argv)
    try:
        size = tuple(int(v) for v in args.size.lower().split("x"))
        if len(size) != 2 or min(size) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--size must be WIDTHxHEIGHT, e.g. 1366x768; got {args.size!r}")
    args.outdir.mkdir(parents=True, exist_ok=True)
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    only = args.lora_only or args.batch_only
    saved = [] if only else [save_dashboard_screenshot(args.outdir / "dashboard.png")]
    if not args.dashboard_only:
        from app.window.event_loop import QtEventLoop

        loop = QtEventLoop(app)
        asyncio.set_event_loop(loop)
        with tempfile.TemporaryDirectory(prefix="pagedeck-shots-") as data_dir, loop:
            os.environ["PAGEDECK_SETTINGS"] = str(Path(data_dir) / "pagedeck.ini")  # never the user's preferences
            if not only:
                saved += loop.run_until_complete(
                    _stream_main_window(args.outdir, args.seconds, Path(data_dir), size, args.theme))
            if not args.batch_only:
                saved += loop.run_until_complete(_stream_lora_chats(args.outdir, args.seconds, Path(data_dir) / "lora"))
            if args.batch_only or not only:
                saved += loop.run_until_complete(_batch_run(args.outdir, args.seconds, Path(data_dir) / "batch"))
    for path in saved:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

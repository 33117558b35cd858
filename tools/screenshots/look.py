"""Screenshots of the chat's look: `python -m tools.screenshots.look OUTDIR [--size WxH] [--theme light|dark]
[--font-scale 2] [--scale 2]`, or `--all` for every look the app must pass.

Opens the real main window on a scratch history with the embedded default model (offscreen or under Xvfb:
`xvfb-run -s "-screen 0 1366x768x24"`), filling a screen of that size with its side panels at their first-start
share, and saves app-empty-chat-<size>[-dark].png, a new chat's start page (the model, the presets, example
prompts), then sends the first example prompt, lets the reply finish and saves
app-message-actions-<size>[-dark].png: the user's bubble, the reply, and the reply's action buttons shown as
the mouse rests on it. `--font-scale 2` makes the application font twice the desktop's (the name gains
-font200) and `--scale 2` draws at twice the pixels (QT_SCALE_FACTOR; the size stays logical, the name
gains @2x).

`--all` runs one child process per look, each on an offscreen screen of exactly its size: 1280x720,
1366x768 and 1920x1080 in light and dark, and 200 % fonts at 1366x768 drawn at 2x in light and dark.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from tools.screenshots._session import qt_session, save_grab

SIDE_SHARES = (0.15, 0.26)  # the chat list's and the right panels' share of the width, as on a first start
# (size, theme, font scale, pixel scale) of every look --all takes
LOOKS = [(size, theme, 1.0, 1) for size in ("1280x720", "1366x768", "1920x1080") for theme in ("light", "dark")] + [
    ("1366x768", theme, 2.0, 2) for theme in ("light", "dark")]


def hover(pane, message_id: int) -> None:
    """Move the mouse onto a message's header, as a user would, so its action bar shows."""
    from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication

    view = pane.view
    block = view.document().findBlock(pane.transcript.headers[message_id][0])
    rect = view.document().documentLayout().blockBoundingRect(block)
    at = QPoint(int(rect.left()) + 80, int(rect.center().y()) - view.verticalScrollBar().value())
    QApplication.sendEvent(view.viewport(), QMouseEvent(
        QEvent.Type.MouseMove, QPointF(at), QPointF(view.viewport().mapToGlobal(at)), Qt.MouseButton.NoButton,
        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier))


def look_name(size: tuple[int, int], theme: str, font_scale: float, scale: int) -> str:
    """The file-name part of a look: 1366x768, 1366x768-dark, 1366x768@2x-font200-dark."""
    return (f"{size[0]}x{size[1]}{'@%dx' % scale if scale != 1 else ''}"
            f"{'-font%d' % round(font_scale * 100) if font_scale != 1 else ''}{'-dark' if theme == 'dark' else ''}")


async def _shots(outdir: Path, data_dir: Path, size: tuple[int, int], theme: str, seconds: float,
                 name: str) -> list[Path]:
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from app.window.main_window import MainWindow

    window = MainWindow(data_dir=data_dir)
    window.theme.set_mode(theme)
    window.show()
    window.resize(*size)  # the whole screen, its side panels at their first-start share of it
    side = [window.dock("Chats"), window.dashboard]
    window.resizeDocks(side, [int(size[0] * share) for share in SIDE_SHARES], Qt.Orientation.Horizontal)
    for _ in range(5):
        QApplication.processEvents()
    try:
        if not await window.loader.ready():
            raise SystemExit(f"model did not load: {window.status.last_error}")
        pane = window.new_chat()
        pane.update_empty_state()
        await asyncio.sleep(0.5)
        saved = [save_grab(window, outdir / f"app-empty-chat-{name}.png")]
        pane.session.set_settings(replace(pane.session.settings, max_new_tokens=90, seed=1))
        pane.empty_state.example_buttons[0].click()
        pane.submit()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while pane.session.running and loop.time() < deadline:
            await asyncio.sleep(0.2)
        if pane.session.running:
            await pane.session.stop()
        await asyncio.sleep(0.3)
        hover(pane, pane.session.messages[-1].id)
        await asyncio.sleep(0.3)
        saved.append(save_grab(window, outdir / f"app-message-actions-{name}.png"))
        return saved
    finally:
        await window.shutdown()
        window.close()


def _all(outdir: Path, seconds: float) -> int:
    """Every look in its own process, on an offscreen screen of its size (its pixels at --scale)."""
    failed = 0
    with tempfile.TemporaryDirectory(prefix="pagedeck-look-screens-") as scratch:
        for size, theme, font_scale, scale in LOOKS:
            w, h = (int(v) for v in size.split("x"))
            config = Path(scratch) / f"{size}@{scale}.json"
            config.write_text(json.dumps({"screens": [{"name": "look", "x": 0, "y": 0, "width": w * scale,
                                                       "height": h * scale, "logicalDpi": 96, "logicalBaseDpi": 96,
                                                       "dpr": 1}]}))
            env = {**os.environ, "QT_QPA_PLATFORM": f"offscreen:configfile={config}", "QT_SCALE_FACTOR": str(scale)}
            args = [sys.executable, "-m", "tools.screenshots.look", str(outdir), "--size", size, "--theme", theme,
                    "--font-scale", str(font_scale), "--scale", str(scale), "--seconds", str(seconds)]
            done = subprocess.run(args, env=env)
            failed += done.returncode != 0
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save screenshots of a new chat and of a message's actions.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--size", default="1366x768", help="window size WxH (logical pixels)")
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    parser.add_argument("--font-scale", type=float, default=1.0, help="the application font times this")
    parser.add_argument("--scale", type=int, choices=(1, 2), default=1,
                        help="device pixels per logical pixel (set QT_SCALE_FACTOR to match; --all does)")
    parser.add_argument("--all", action="store_true", help="every look: 3 sizes x 2 themes, and 200 %% fonts at 2x")
    parser.add_argument("--seconds", type=float, default=120.0, help="the longest to wait for the reply")
    args = parser.parse_args(argv)
    try:
        size = tuple(int(v) for v in args.size.lower().split("x"))
        if len(size) != 2 or min(size) <= 0:
            raise ValueError
    except ValueError:
        parser.error(f"--size must be WIDTHxHEIGHT, e.g. 1366x768; got {args.size!r}")
    if not 0.5 <= args.font_scale <= 4:
        parser.error(f"--font-scale must be between 0.5 and 4; got {args.font_scale}")
    args.outdir.mkdir(parents=True, exist_ok=True)
    if args.all:
        return _all(args.outdir, args.seconds)
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    if args.font_scale != 1:
        font = app.font()
        font.setPointSizeF(font.pointSizeF() * args.font_scale)
        app.setFont(font)
    name = look_name(size, args.theme, args.font_scale, args.scale)
    with qt_session("pagedeck-look-") as (loop, data_dir):
        for path in loop.run_until_complete(_shots(args.outdir, Path(data_dir), size, args.theme, args.seconds, name)):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

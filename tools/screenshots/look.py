"""Screenshots of the chat's look: `python -m tools.screenshots.look OUTDIR [--size WxH] [--theme light|dark]`.

Opens the real main window on a scratch history with the embedded default model (offscreen or under Xvfb:
`xvfb-run -s "-screen 0 1366x768x24"`) and saves app-empty-chat-<size>[-dark].png, a new chat's start page
(the model, the presets, example prompts), then sends the first example prompt, lets the reply finish and
saves app-message-actions-<size>[-dark].png: the user's bubble, the reply, and the reply's action buttons
shown as the mouse rests on it.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from tools.screenshots._session import qt_session, save_grab


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


async def _shots(outdir: Path, data_dir: Path, size: tuple[int, int], theme: str, seconds: float) -> list[Path]:
    from app.window.main_window import MainWindow

    window = MainWindow(data_dir=data_dir)
    window.theme.set_mode(theme)
    window.show()
    window.resize(*size)
    name = f"{size[0]}x{size[1]}{'-dark' if theme == 'dark' else ''}"
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save screenshots of a new chat and of a message's actions.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--size", default="1366x768", help="window size WxH")
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    parser.add_argument("--seconds", type=float, default=120.0, help="the longest to wait for the reply")
    args = parser.parse_args(argv)
    try:
        size = tuple(int(v) for v in args.size.lower().split("x"))
        if len(size) != 2 or min(size) <= 0:
            raise ValueError
    except ValueError:
        parser.error(f"--size must be WIDTHxHEIGHT, e.g. 1366x768; got {args.size!r}")
    from PySide6.QtWidgets import QApplication

    QApplication.instance() or QApplication(sys.argv[:1])
    args.outdir.mkdir(parents=True, exist_ok=True)
    with qt_session("pagedeck-look-") as (loop, data_dir):
        for path in loop.run_until_complete(_shots(args.outdir, Path(data_dir), size, args.theme, args.seconds)):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

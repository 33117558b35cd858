"""What every screenshot tool shares to drive the real window: its Qt event loop on a scratch data folder
(`qt_session`), a widget saved as PNG (`save_grab`), and a chat's newest reply as it streams
(`reply_state`, `until_streamed`: shots are taken mid-stream, on a fast GPU and a slow CPU alike).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from pathlib import Path

from engine import envs


def save_grab(widget, path: Path) -> Path:
    """Write what `widget` shows now to `path` (PNG); OSError if it could not be written."""
    if not widget.grab().save(str(path)):
        raise OSError(f"could not write screenshot {path}")
    return path



def screen_size(text: str) -> tuple[int, int]:
    """A --size argument, WIDTHxHEIGHT (argparse's type: a bad one is a usage error naming it)."""
    try:
        size = tuple(int(v) for v in text.lower().split("x"))
        if len(size) != 2 or min(size) <= 0:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be WIDTHxHEIGHT, e.g. 1366x768; got {text!r}") from None
    return size

@contextlib.contextmanager
def qt_session(prefix: str):
    """The app's Qt event loop and a scratch data folder (preferences and history there, never the
    user's), for a tool that drives the real window: yields (loop, data folder)."""
    from PySide6.QtWidgets import QApplication

    from app.window.event_loop import QtEventLoop

    app = QApplication.instance() or QApplication(sys.argv[:1])
    loop = QtEventLoop(app)
    asyncio.set_event_loop(loop)
    with tempfile.TemporaryDirectory(prefix=prefix) as data_dir, loop:
        os.environ["PAGEDECK_SETTINGS"] = str(Path(data_dir) / "pagedeck.ini")
        envs.refresh("PAGEDECK_SETTINGS")  # read it again, were it read before
        yield loop, Path(data_dir)


def reply_state(session) -> tuple[str, str | None]:
    """(text so far, error) of a chat's newest reply, live while it streams."""
    reply = session.messages[-1]
    live = session.live(reply.id)
    if live is not None:
        return live[0], live[1].error
    return reply.content, reply.stats.error if reply.stats is not None else None


async def until_streamed(sessions: list, min_chars: int, timeout: float) -> None:
    """Wait until every reply shows `min_chars` of text (or one ends, or time runs out); fail on errors.

    Waiting on text rather than a fixed delay keeps the shots mid-stream on a fast GPU and a slow CPU alike.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        states = [reply_state(s) for s in sessions]
        errors = [e for _, e in states if e]
        if errors:
            raise SystemExit(f"a chat failed while streaming, no screenshot taken: {errors[0]}")
        if any(not s.running for s in sessions) or all(len(t) >= min_chars for t, _ in states):
            return
        await asyncio.sleep(0.1)

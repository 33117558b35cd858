"""`python -m app` / `pagedeck`: open the desktop app (one asyncio loop on the Qt thread, via qasync);
`pagedeck COMMAND ...` runs a terminal command instead (app.cli: ls, get, run, serve, ...)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Sequence

from app.core import qt_libs
from app.window import desktop
from engine.contract import DEFAULT_CACHE_TOKENS
from engine.contract import DEFAULT_PAGE_SIZE as PAGE_SIZE
from engine.contract import model_path_problem


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from app.cli.commands import commands_help

    p = argparse.ArgumentParser(prog="pagedeck", usage="pagedeck [flags]\n       pagedeck [command] [flags]",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Chat with several conversations at once, all batched: the desktop app "
                                            "(flags below), or a command.\n\n" + commands_help(),
                                epilog='Use "pagedeck [command] --help" for more about a command.')
    p.add_argument("--model", type=Path, default=None,
                   help="Hugging Face model folder or .gguf file (default: the last session's model, "
                        "else the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--data-dir", type=Path, default=None, help="where chat history lives (default: the user data dir)")
    p.add_argument("--cache-tokens", type=int, default=None,
                   help=f"K/V cache size in tokens, shared by all chats (multiple of {PAGE_SIZE}; default: the last "
                        f"session's, else {DEFAULT_CACHE_TOKENS})")
    p.add_argument("--install-desktop", action="store_true",
                   help="add pagedeck to the desktop's app menu (.desktop file and icon under $XDG_DATA_HOME) and exit")
    p.add_argument("--uninstall-desktop", action="store_true", help="remove what --install-desktop added and exit")
    args = p.parse_args(argv)
    problem = model_path_problem(args.model) if args.model is not None else None
    if problem is not None:
        p.error(f"--model: {problem}")
    if args.cache_tokens is not None and args.cache_tokens < PAGE_SIZE:
        p.error(f"--cache-tokens must be at least one page ({PAGE_SIZE}), got {args.cache_tokens}")
    return args


async def run(args: argparse.Namespace) -> int:
    from app.core.instance_lock import AlreadyRunning
    from app.core.store_open import HistoryUnavailable
    from app.window.main_window import MainWindow

    try:
        window = MainWindow(data_dir=args.data_dir, load_request={"path": str(args.model) if args.model else None,
                                                                  "cache_tokens": args.cache_tokens})
    except (AlreadyRunning, HistoryUnavailable) as exc:  # refused before anything was written
        refuse(str(exc))
        return 1
    closed = asyncio.Event()
    window.closing.connect(closed.set)
    # a terminated app (kill, a session ending) shuts down as a closed window does: replies saved, files removed
    signal.signal(signal.SIGTERM, lambda *_: asyncio.get_event_loop().call_soon(window.close))
    window.show()
    restoring = asyncio.ensure_future(window.restore_session())  # chats, model and LoRA set of the last run
    await closed.wait()
    if not restoring.done():
        restoring.cancel()
    await window.shutdown()
    return 0


def refuse(message: str) -> None:
    """Say why this instance won't start: on stderr, and in a dialog where there is a screen to show it."""
    print(f"pagedeck: {message}", file=sys.stderr, flush=True)
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QMessageBox

    if QGuiApplication.platformName() not in ("offscreen", "minimal"):
        QMessageBox.critical(None, "pagedeck", message)


def desktop_command(install: bool) -> int:
    """--install-desktop / --uninstall-desktop: report each file written or removed."""
    try:
        paths = desktop.install_desktop() if install else desktop.uninstall_desktop()
    except (OSError, RuntimeError) as e:
        print(f"pagedeck: {e}", file=sys.stderr)
        return 1
    for path in paths:
        print(("wrote " if install else "removed ") + str(path))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from app.cli.commands import COMMANDS

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in COMMANDS:
        from app.cli.main import main as command

        return command(argv)
    args = parse_args(argv)
    if args.install_desktop or args.uninstall_desktop:
        return desktop_command(args.install_desktop)
    missing = qt_libs.check()
    if missing:  # Qt would abort with "could not load the Qt platform plugin" and no package names
        print(missing, file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from PySide6.QtWidgets import QApplication

    from app.window.event_loop import QtEventLoop

    app = QApplication.instance() or QApplication(sys.argv[:1])
    desktop.apply_identity(app)  # application name, desktop file name (Wayland app id) and window icon
    app.setQuitOnLastWindowClosed(False)  # shutdown() must run on the loop before Qt quits
    loop = QtEventLoop(app)
    asyncio.set_event_loop(loop)
    with loop:
        return loop.run_until_complete(run(args))


if __name__ == "__main__":
    raise SystemExit(main())

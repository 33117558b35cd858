"""`python -m app` / `pagedeck`: open the desktop app (one asyncio loop on the Qt thread, via qasync)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Sequence

from engine.contract import DEFAULT_CACHE_TOKENS
from engine.contract import DEFAULT_PAGE_SIZE as PAGE_SIZE
from engine.contract import model_path_problem


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pagedeck", description="Chat with several conversations at once, all batched.")
    p.add_argument("--model", type=Path, default=None,
                   help="Hugging Face model folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--data-dir", type=Path, default=None, help="where chat history lives (default: the user data dir)")
    p.add_argument("--cache-tokens", type=int, default=DEFAULT_CACHE_TOKENS,
                   help=f"K/V cache size in tokens, shared by all chats (multiple of {PAGE_SIZE})")
    args = p.parse_args(argv)
    problem = model_path_problem(args.model) if args.model is not None else None
    if problem is not None:
        p.error(f"--model: {problem}")
    if args.cache_tokens < PAGE_SIZE:
        p.error(f"--cache-tokens must be at least one page ({PAGE_SIZE}), got {args.cache_tokens}")
    return args


async def run(args: argparse.Namespace) -> int:
    from app.main_window import MainWindow

    window = MainWindow(data_dir=args.data_dir,
                        load_request={"path": str(args.model) if args.model else None, "cache_tokens": args.cache_tokens})
    closed = asyncio.Event()
    window.closing.connect(closed.set)
    window.show()
    chats = window.store.chats()
    if chats:
        window.open_chat(chats[0].id)
    else:
        window.new_chat()
    window.load_model()
    await closed.wait()
    await window.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import qasync
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("pagedeck")
    app.setQuitOnLastWindowClosed(False)  # shutdown() must run on the loop before Qt quits
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    with loop:
        return loop.run_until_complete(run(args))


if __name__ == "__main__":
    raise SystemExit(main())

"""serve, bench and batch: the engine's own commands, run as `python -m engine COMMAND ARGS` in this process's
place (exec), so flags, help, exit status and signals are exactly the engine's and the app never imports the
engine's command line (only its public API)."""
from __future__ import annotations

import os
import sys


def add_parser(parser, name: str) -> None:
    parser.add_argument("args", nargs="*", help=f"the flags of `python -m engine {name}` (see its --help)")


def forward(command: str, args: list[str]) -> int:
    argv = [sys.executable, "-m", "engine", command, *args]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return 0  # not reached


def run(args) -> int:
    return forward(args.command, args.args)

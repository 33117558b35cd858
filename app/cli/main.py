"""The `pagedeck` subcommands' parser and dispatch, with an Ollama-style help: one line per command.

Each command module has `add_parser(parser, name)` (its flags) and `run(args) -> int`. Expected failures
print one `pagedeck: ...` line on stderr and exit 1; usage errors exit 2 (argparse). The command modules
import the engine and the Hub client inside run(), so `pagedeck --help` and completion answer at once.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from app.cli import completion, forward, get, ls, ps, rm, run
from app.cli.commands import COMMANDS, FORWARDED, commands_help
from app.cli.errors import CLIError

MODULES = {"serve": forward, "bench": forward, "batch": forward, "run": run, "ls": ls, "get": get, "rm": rm,
           "ps": ps, "completion": completion}


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagedeck", usage="pagedeck [command] [flags]", formatter_class=_Formatter,
        description="Chat with local models: the desktop app, or a command below.\n\n" + commands_help(),
        epilog='Use "pagedeck [command] --help" for more about a command; "pagedeck" alone opens the app.')
    sub = parser.add_subparsers(dest="command", metavar="command", required=True, help=argparse.SUPPRESS)
    for name, line in COMMANDS.items():
        p = sub.add_parser(name, prog=f"pagedeck {name}", description=line, formatter_class=_Formatter)
        MODULES[name].add_parser(p, name)
    return parser


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv[:1] and argv[0] in FORWARDED:  # every flag goes to the engine's own parser, --help included
        return forward.forward(argv[0], argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "run" and not any(e.startswith("-") for e in extra):
        args.prompt += extra  # `pagedeck run MODEL --greedy why is the sky blue`: the words after the flags
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return MODULES[args.command].run(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except CLIError as e:
        print(f"pagedeck: {e}", file=sys.stderr)
        return 1

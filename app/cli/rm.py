"""`pagedeck rm MODEL`: delete a model downloaded into the Hugging Face cache (by `pagedeck get`, the Discover
tab or any Hub tool), after asking (or with -y). Models elsewhere (LM Studio, Ollama, added folders) are
other tools' files: it names their path and leaves them alone."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from app.cli import models
from app.cli.errors import CLIError


def add_parser(parser, name: str) -> None:
    parser.add_argument("model", nargs="+", metavar="MODEL", help="a name as `pagedeck ls` shows it")
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask")


def removal(m, hub: Path) -> list[Path]:
    """What deleting a found model removes: its repository folder when nothing else of it stays, else the
    GGUF's snapshot link and the blob it points to."""
    try:
        rel = Path(m.path).relative_to(hub)
    except ValueError:
        raise CLIError(f"{m.name} is not a download in {hub} ({m.source}: {m.path}); delete it there") from None
    repo = hub / rel.parts[0]
    if Path(m.path).is_dir():
        return [repo]
    snapshot = Path(m.path).parent
    others = [p for p in snapshot.rglob("*.gguf") if p != Path(m.path) and not p.name.startswith("mmproj")]
    if not others and not (snapshot / "config.json").exists():
        return [repo]
    return [Path(m.path), Path(m.path).resolve()]


def run(args) -> int:
    from app.discover.hub import hub_cache_dir

    hub = hub_cache_dir()
    found = [m for m in models.find() if m.source == "Hugging Face cache"]
    for name in args.model:
        try:
            m = models.resolve(name, found)
        except LookupError as e:
            raise CLIError(str(e)) from None
        paths = removal(m, hub)
        if not args.yes:
            if not sys.stdin.isatty():
                raise CLIError(f"not deleting {m.name} without a terminal to ask on; pass -y")
            answer = input(f"Delete {m.name} ({', '.join(map(str, paths))})? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("kept", m.name)
                continue
        for p in paths:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                os.unlink(p)
        print("deleted", m.name)
    return 0

"""`pagedeck ls`: every model found, as the Model tab lists them: name, architecture, parameters,
quantization, size and whether the engine's memory estimate says it fits (for --ctx tokens of cache)."""
from __future__ import annotations

import json
from pathlib import Path

from app.cli import models
from app.core.formatting import human_bytes, human_count


def add_parser(parser, name: str) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    parser.add_argument("--folder", action="append", default=[], metavar="DIR",
                        help="look in this folder too (the Model tab's added folders always count)")
    parser.add_argument("--ctx", type=int, default=8192, metavar="TOKENS",
                        help="KV cache size the fit estimate assumes (default 8192)")
    parser.add_argument("--data-dir", type=Path, default=None, help="the app's data folder (default: the user's)")


def row(m) -> dict:
    """One model as --json writes it."""
    info = m.info
    return {"name": m.name, "path": str(m.path), "source": m.source, "architecture": info.arch,
            "parameters": info.params or None, "quantization": info.quant or None, "size_bytes": info.file_bytes,
            "sees_images": m.sees_images, "supported": m.supported, "problem": m.reason,
            "fits": m.fits if m.supported else None,
            "needs_bytes": m.estimate.total_bytes if m.estimate is not None else None}


def run(args) -> int:
    found = models.find(args.data_dir, args.folder, args.ctx)
    if args.json:
        print(json.dumps([row(m) for m in found], indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not found:
        console.print("No models found besides the embedded SmolLM2-135M-Instruct (`pagedeck run default`). "
                      "`pagedeck get REPO` downloads one; `pagedeck ls --folder DIR` looks in a folder of your own.",
                      highlight=False)
        return 0
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col, justify in (("NAME", "left"), ("ARCH", "left"), ("PARAMS", "right"), ("QUANT", "left"),
                         ("SIZE", "right"), ("FITS", "left"), ("SOURCE", "left")):
        table.add_column(col, justify=justify, overflow="fold" if col == "NAME" else "ellipsis")
    for m in found:
        info = m.info
        fits = ("[red]no[/]" if m.fits is False else "yes" if m.fits else "?") if m.supported else "[dim]—[/]"
        style = None if m.supported else "dim"
        table.add_row(m.name, (info.arch or "?") + (" +images" if m.sees_images else ""),
                      human_count(info.params) if info.params else "", info.quant, human_bytes(info.file_bytes),
                      fits, m.source, style=style)
    console.print(table)
    unusable = [m for m in found if not m.supported]
    for m in unusable:
        console.print(f"[dim]{m.name}: not supported: {m.reason}[/]", highlight=False)
    return 0

"""`pagedeck get REPO[/FILE]`: download a model from the Hugging Face Hub into the cache the Discover tab
and discovery use (app.discover.download: huggingface_hub's cache layout, resume by HTTP Range, a hash check
before the file is loadable). HF_ENDPOINT and HF_TOKEN work as in every Hub tool.

Which file of a GGUF repository: FILE when given, else the one whose quantization is --quant, else the
largest that the engine's estimate says fits (Q4_K_M among equals: the usual choice). A dropped connection is
resumed where it stopped (a few times), and a stopped `get` resumes from the partial file when run again.
"""
from __future__ import annotations

import sys

from app.cli.errors import CLIError

RETRIES = 5  # resumes after a dropped connection, each one only while bytes keep arriving
PREFERRED = ("Q4_K_M", "Q5_K_M", "Q4_K_S", "Q6_K", "Q8_0")


def add_parser(parser, name: str) -> None:
    parser.add_argument("model", metavar="REPO[/FILE]", help="a Hub repository (org/name), optionally one file of it")
    parser.add_argument("--quant", metavar="Q", help="the quantization to take (Q4_K_M, Q8_0, ...), as in file names")
    parser.add_argument("--hf", action="store_true", help="take the safetensors folder, not a GGUF file")


def choose(models: list, file: str | None, quant: str | None, hf: bool):
    """The entry of a repository's listing (app.discover.hub.Hub.files) the flags ask for."""
    usable = [m for m in models if m.problem is None]
    if file:
        hit = [m for m in models if m.name == file or m.name.split("/")[-1] == file]
        if not hit:
            raise CLIError(f"no file {file!r} in the repository; it offers: {_names(models)}")
        if hit[0].problem:
            raise CLIError(f"{file}: {hit[0].problem}")
        return hit[0]
    if hf:
        usable = [m for m in usable if m.kind == "hf"]
    if quant:
        usable = [m for m in usable if m.quant.upper() == quant.upper()]
        if not usable:
            raise CLIError(f"no {quant} file in the repository; it offers: {_names(models)}")
    if not usable:
        raise CLIError("nothing in the repository that pagedeck can load" + (f": {_names(models)}" if models else ""))
    fitting = [m for m in usable if m.fits is not False] or usable
    ggufs = [m for m in fitting if m.kind == "gguf"]
    if ggufs and not quant:
        preferred = [m for q in PREFERRED for m in ggufs if m.quant.upper() == q and m.fits is not False]
        return preferred[0] if preferred else max(ggufs, key=lambda m: m.size)
    return max(fitting, key=lambda m: m.size)


def _names(models: list) -> str:
    return ", ".join(f"{m.name} ({m.quant or m.kind})" for m in models) or "no loadable files"


def run(args) -> int:
    from app.discover.download import DONE, DownloadJob
    from app.discover.hub import Hub, HubError, hub_cache_dir

    parts = args.model.strip("/").split("/", 2)
    if len(parts) < 2:
        raise CLIError(f"expected REPO as org/name (e.g. bartowski/SmolLM2-135M-Instruct-GGUF), got {args.model!r}")
    repo_id, file = "/".join(parts[:2]), (parts[2] if len(parts) > 2 else None)
    hub = Hub()
    try:
        listing = hub.files(repo_id)
    except HubError as e:
        raise CLIError(str(e)) from None
    model = choose(listing, file, args.quant, args.hf)
    job = DownloadJob(model, hub_cache_dir(), hub.endpoint)
    print(f"pulling {repo_id}/{model.name} ({model.quant or model.kind})", file=sys.stderr)
    _follow(job)
    tries, before = 0, 0
    while job.state != DONE and tries < RETRIES and job.done_bytes > before and "hash check" not in job.error:
        print(f"resuming after: {job.error}", file=sys.stderr)  # only while each try got further
        tries, before = tries + 1, job.done_bytes
        _follow(job)
    if job.state != DONE:
        raise CLIError(job.error or f"download {job.state}")
    print(job.path)
    return 0


def _follow(job) -> None:
    """Run the job to its end, drawing rich's progress bar on stderr; Ctrl-C pauses it (the partial file is
    kept for the next `get`)."""
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(job.model.name, total=job.total_bytes, completed=job.done_bytes)
        job.start()
        try:
            while not job.wait(0.1):
                bar.update(task, completed=job.done_bytes)
        except KeyboardInterrupt:
            job.pause()
            job.wait(30)
            raise
        bar.update(task, completed=job.done_bytes)

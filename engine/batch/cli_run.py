"""`python -m engine batch`: a batch run from the command line, over a DynamicGeneratorAsync of its own.

Every finished row is appended to a progress file (`<output>.progress.jsonl`, flushed and fsynced per
row) before the next one is reported, so a run killed at any moment resumes with the same command:
rows already in the progress file are not run again, the others are. The progress file's first line
records the template, system prompt and input file, and each row its key (position + content): a
resume with another template or an edited file is refused instead of mixing two runs. When every row
is done the output (.csv or .jsonl) is written in input order.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..contract import DEFAULT_CACHE_TOKENS, DEFAULT_PAGE_SIZE, check_model_path
from .export import export_results
from .inputs import BatchRow, PromptTemplate, batch_messages, read_inputs
from .loop import BatchLoop, RowResult


def add_batch_parser(sub, weight_names):
    b = sub.add_parser("batch", help="run a prompt template over every row of a CSV/JSONL file (resumable)")
    b.add_argument("--model", metavar="PATH", help="HF model folder or .gguf file (default: the embedded SmolLM2)")
    b.add_argument("--weights", choices=weight_names, default="auto",
                   help="auto (default): a GGUF's 4-bit blocks in the CPU matmuls, else dense; dense: exact fp32")
    b.add_argument("--input", required=True, metavar="FILE", help="a .csv (with a header row) or .jsonl file")
    b.add_argument("--template", required=True, metavar="TEXT",
                   help="the user message, {column} fields filled from each row, e.g. 'Summarise: {text}'")
    b.add_argument("--system", metavar="TEXT", help="system prompt shared by every row (its cache pages too)")
    b.add_argument("--output", required=True, metavar="FILE",
                   help="results (.csv or .jsonl), written when every row is done; progress is kept in "
                        "FILE.progress.jsonl, so the same command resumes a stopped run")
    b.add_argument("--max-new-tokens", type=int, default=256, metavar="N")
    b.add_argument("--concurrency", type=int, default=32, metavar="N",
                   help="rows in flight at once (the generator batches them; default 32)")
    b.add_argument("--cache-tokens", type=int, default=DEFAULT_CACHE_TOKENS, metavar="N",
                   help=f"K/V cache size in tokens (default {DEFAULT_CACHE_TOKENS})")
    b.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return b  # the sampler flags are engine.cli's (one set for every generating command)


def progress_path(output: str | Path) -> Path:
    output = Path(output)
    return output.with_name(output.name + ".progress.jsonl")


class ProgressFile:
    """The run's header and one line per finished row; tolerates a last line cut by a kill."""

    def __init__(self, path: Path, header: dict):
        self.path = path
        self.done: dict[str, dict] = {}  # row key -> its line
        if path.exists():
            self._load(header)
        else:
            self._write(json.dumps({"run": header}, ensure_ascii=False) + "\n", "w")

    def _load(self, header: dict) -> None:
        lines = self.path.read_bytes().split(b"\n")
        good = 0  # bytes of whole, valid lines
        for n, raw in enumerate(lines):
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                break  # the tail a kill cut off (nothing after it was written)
            if n == 0:
                if obj.get("run") != header:
                    diff = [k for k in header if (obj.get("run") or {}).get(k) != header[k]]
                    raise ValueError(f"{self.path} belongs to another run (its {', '.join(diff) or 'header'} "
                                     f"differs): use another --output, or delete it to start over")
            else:
                self.done[obj["key"]] = obj
            good += len(raw) + 1
        with open(self.path, "r+b") as f:  # drop a cut-off last line before appending
            f.truncate(min(good, os.path.getsize(self.path)))

    def add(self, row: BatchRow, result: RowResult) -> None:
        line = {"index": row.index, "key": row.key, **result.as_dict()}
        self._write(json.dumps(line, ensure_ascii=False) + "\n", "a")
        self.done[row.key] = line

    def _write(self, text: str, mode: str) -> None:
        with open(self.path, mode, encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def run_batch(args: Any, settings: Any) -> int:
    """The `batch` command (settings: the SamplerSettings engine.cli built from the flags)."""
    for name in ("max_new_tokens", "concurrency", "cache_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    columns, rows = read_inputs(args.input)
    template = PromptTemplate(args.template)
    template.check_columns(columns)
    if Path(args.output).suffix.lower() not in (".csv", ".jsonl"):
        raise ValueError(f"--output must be a .csv or .jsonl file, got {args.output}")
    if args.model is not None:
        check_model_path(args.model)
    header = {"template": args.template, "system": args.system or "", "input": str(Path(args.input).resolve())}
    progress = ProgressFile(progress_path(args.output), header)
    todo = [row for row in rows if row.key not in progress.done]
    stale = set(progress.done) - {row.key for row in rows}
    if stale:
        raise ValueError(f"{args.input} changed since this run started ({len(stale)} finished row(s) are no longer "
                         f"in it): use another --output, or delete {progress.path} to start over")
    say = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    say(f"batch: {len(rows)} rows, {len(rows) - len(todo)} already done, {len(todo)} to run")
    if todo:
        stopped_by = asyncio.run(_run(args, settings, template, todo, progress, len(rows), say))
        if stopped_by is not None:
            print(f"error: the run stopped ({stopped_by}); {len(progress.done)} of {len(rows)} rows are done: "
                  f"run the same command to resume", file=sys.stderr)
            return 1
    by_key = progress.done
    records = [(row.values, by_key[row.key]) for row in rows]
    n = export_results(args.output, columns, records)
    failed = sum(1 for _, r in records if r.get("error"))
    say(f"batch: wrote {n} rows to {args.output}" + (f" ({failed} failed: see their error column)" if failed else ""))
    return 0


async def _run(args, settings, template: PromptTemplate, todo: list[BatchRow], progress: ProgressFile,
               total: int, say) -> str | None:
    """Run the rows; returns why the engine stopped the run, or None."""
    from ..cache.paged_cache import PagedCache
    from ..generator.async_api import DynamicGeneratorAsync, DynamicJobAsync
    from ..model.model_and_tokenizer import load_model_and_tokenizer

    model, tokenizer = await asyncio.to_thread(load_model_and_tokenizer, args.model, weights=args.weights)
    page_size = DEFAULT_PAGE_SIZE
    cache = PagedCache(model, max_tokens=max(page_size, args.cache_tokens // page_size * page_size), page_size=page_size)
    generator = DynamicGeneratorAsync(model=model, cache=cache, tokenizer=tokenizer)
    stops = sorted(tokenizer.stop_token_ids)

    async def start(row: BatchRow):
        text = tokenizer.apply_chat_template(batch_messages(args.system, template.render(row)),
                                             add_generation_prompt=True)
        ids = tokenizer.encode(text, encode_special_tokens=True)
        job = DynamicJobAsync(generator, input_ids=ids, max_new_tokens=args.max_new_tokens, gen_settings=settings,
                              seed=None if args.seed is None else args.seed + row.index, stop_conditions=stops,
                              identifier=f"batch row {row.index}")
        try:
            async for r in job:
                yield r
        finally:
            await job.cancel()  # no-op once finished

    done = total - len(todo)

    def finished(row: BatchRow, result: RowResult) -> None:
        nonlocal done
        progress.add(row, result)
        done += 1
        say(f"batch: {done}/{total} done (row {row.index}"
            + (f": error {result.error})" if result.error else f", {result.new_tokens} tokens)"))

    loop = BatchLoop(start, finished, concurrency=args.concurrency)
    try:
        await loop.run(todo)
    finally:
        await generator.close()
    return loop.stopped_by

"""A batch run in the app: rows of a file through the chats' Backend, results into the history database.

Qt-free (the view, app.batch, shows it). The scheduling is engine.batch's BatchLoop, the same as the
CLI's; here each row is a job of the window's Backend (the local generator, which batches the rows with
the chats and shares the system prompt's pages, or a remote server), and each finished row is stored
(app.core.batch_runs) before it is reported, so a pause, a crash or a closed window loses only the rows
in flight, which the next resume runs again. Row i is seeded seed + i when the settings have a seed.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from app.core.backend import Backend
from app.core.batch_runs import BatchRunRecord, BatchRuns
from app.core.store import ChatSettings
from engine.batch.export import export_results
from engine.batch.inputs import BatchRow, PromptTemplate, read_inputs
from engine.batch.loop import BatchLoop, RowResult

DEFAULT_CONCURRENCY = 16


class BatchController:
    """Prepare, run, pause and export batch runs. `on_row(run_id, row, result dict)` is called as each row
    is stored; `on_state(run_id, state)` when a run starts, pauses or finishes."""

    def __init__(self, runs: BatchRuns, backend: Backend, on_row: Callable[[int, BatchRow, dict], None],
                 on_state: Callable[[int, str], None], concurrency: int = DEFAULT_CONCURRENCY):
        self.runs = runs
        self.backend = backend
        self.on_row, self.on_state = on_row, on_state
        self.concurrency = concurrency
        self._loop: BatchLoop | None = None
        self.stopped_by: str | None = None  # why the engine stopped the last run (model closed, not loaded)

    @property
    def running(self) -> bool:
        return self._loop is not None

    def prepare(self, input_path: str | Path, template: str, system_prompt: str, settings: ChatSettings) -> BatchRunRecord:
        """A new run, checked first: the file reads, the template names only columns it has (ValueError)."""
        columns, rows = read_inputs(input_path)
        PromptTemplate(template).check_columns(columns)
        settings = replace(settings, system_prompt=system_prompt).validate()
        return self.runs.create(str(Path(input_path).resolve()), template, system_prompt, settings, columns, len(rows))

    def remaining(self, run: BatchRunRecord) -> list[BatchRow]:
        """The rows of the run's file not stored yet (ValueError if the file changed under a stored row)."""
        columns, rows = read_inputs(run.input_path)
        done = self.runs.done_keys(run.id)
        if done - {row.key for row in rows}:
            raise ValueError(f"{Path(run.input_path).name} changed since this run started: start a new run")
        return [row for row in rows if row.key not in done]

    async def run(self, run_id: int) -> bool:
        """Run (or resume) every row not stored yet; True when the run is complete, False when paused."""
        if self._loop is not None:
            raise RuntimeError("a batch run is already running")
        run = self.runs.run(run_id)
        template = PromptTemplate(run.template)
        todo = self.remaining(run)

        async def start(row: BatchRow):
            ident = ("batch", run.id, row.index)
            settings = run.settings if run.settings.seed is None else replace(run.settings, seed=run.settings.seed + row.index)
            await self.backend.wait_loaded()
            job, _ = self.backend.start_job(ident, [{"role": "user", "content": template.render(row)}], settings)
            ended = False
            try:
                async for r in job:
                    ended = ended or bool(r.get("eos"))
                    yield r
            finally:
                if ended:
                    self.backend.job_ended(ident)
                else:  # paused: the job lets go of its pages now
                    await self.backend.cancel(ident)

        def finished(row: BatchRow, result: RowResult) -> None:
            d = result.as_dict()
            self.runs.add_result(run.id, row.key, row.index, row.values, d)
            self.on_row(run.id, row, d)

        self._loop = BatchLoop(start, finished, concurrency=self.concurrency)
        self.runs.set_state(run.id, "running")
        self.on_state(run.id, "running")
        loop = self._loop
        try:
            complete = await loop.run(todo)
        finally:
            self._loop = None
            self.stopped_by = loop.stopped_by
            state = "done" if len(self.runs.done_keys(run.id)) >= run.total else "paused"
            self.runs.set_state(run.id, state)
            self.on_state(run.id, state)
        return complete

    def pause(self) -> None:
        """Stop the running run (rows in flight are cut off and run again on resume)."""
        if self._loop is not None:
            self._loop.pause()

    def export(self, run_id: int, path: str | Path) -> int:
        """Write the run's stored rows (inputs and outputs, input order) as .csv or .jsonl; returns the count."""
        run = self.runs.run(run_id)
        return export_results(path, run.columns, self.runs.results(run_id))

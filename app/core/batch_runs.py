"""Batch runs in the history database: each run's setup and every row's result, written as it finishes.

Two tables of their own (created if missing, so the chats' schema and its version are untouched): a run
(input file, template, system prompt, chat settings, columns, state) and its results keyed by row key
(position + content, engine.batch.inputs), so a resumed run skips exactly the rows already stored; the
primary key refuses a row stored twice. A run that was "running" when the process died reads as
"paused" on the next open.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from app.core.store import ChatSettings, Store

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    input_path TEXT NOT NULL,
    template TEXT NOT NULL,
    system_prompt TEXT NOT NULL,
    settings TEXT NOT NULL,
    columns TEXT NOT NULL,
    total INTEGER NOT NULL,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_results (
    run_id INTEGER NOT NULL REFERENCES batch_runs(id) ON DELETE CASCADE,
    row_key TEXT NOT NULL,
    row_index INTEGER NOT NULL,
    input TEXT NOT NULL,
    output TEXT NOT NULL,
    eos_reason TEXT,
    new_tokens INTEGER NOT NULL,
    error TEXT,
    finished REAL NOT NULL,
    PRIMARY KEY (run_id, row_key)
)
"""
RUN_STATES = ("new", "running", "paused", "done")


@dataclass
class BatchRunRecord:
    id: int
    input_path: str
    template: str
    system_prompt: str
    settings: ChatSettings
    columns: list[str]
    total: int
    state: str


class BatchRuns:
    """The batch tables of one Store (its connection and transactions)."""

    def __init__(self, store: Store):
        self.store = store
        self._db = store._db
        with store._tx():
            for statement in filter(str.strip, _SCHEMA.split(";")):
                self._db.execute(statement)
            self._db.execute("UPDATE batch_runs SET state='paused' WHERE state='running'")  # its process died

    def create(self, input_path: str, template: str, system_prompt: str, settings: ChatSettings,
               columns: list[str], total: int) -> BatchRunRecord:
        with self.store._tx():
            cur = self._db.execute(
                "INSERT INTO batch_runs (created, input_path, template, system_prompt, settings, columns, total, state)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'new')",
                (time.time(), input_path, template, system_prompt, settings.to_json(), json.dumps(columns), total))
        return self.run(cur.lastrowid)

    def run(self, run_id: int) -> BatchRunRecord:
        r = self._db.execute("SELECT * FROM batch_runs WHERE id=?", (run_id,)).fetchone()
        if r is None:
            raise KeyError(f"no batch run {run_id}")
        return BatchRunRecord(r["id"], r["input_path"], r["template"], r["system_prompt"],
                              ChatSettings.from_json(r["settings"]), json.loads(r["columns"]), r["total"], r["state"])

    def latest(self) -> BatchRunRecord | None:
        r = self._db.execute("SELECT id FROM batch_runs ORDER BY id DESC LIMIT 1").fetchone()
        return self.run(r[0]) if r is not None else None

    def set_state(self, run_id: int, state: str) -> None:
        if state not in RUN_STATES:
            raise ValueError(f"unknown batch run state {state!r}")
        self._db.execute("UPDATE batch_runs SET state=? WHERE id=?", (state, run_id))

    def add_result(self, run_id: int, row_key: str, row_index: int, values: dict, result: dict) -> None:
        """Store one finished row (IntegrityError if that row is already stored: a row runs once)."""
        self._db.execute(
            "INSERT INTO batch_results (run_id, row_key, row_index, input, output, eos_reason, new_tokens, error,"
            " finished) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, row_key, row_index, json.dumps(values, ensure_ascii=False), result.get("output", ""),
             result.get("eos_reason"), int(result.get("new_tokens") or 0), result.get("error"), time.time()))

    def done_keys(self, run_id: int) -> set[str]:
        return {r[0] for r in self._db.execute("SELECT row_key FROM batch_results WHERE run_id=?", (run_id,))}

    def results(self, run_id: int) -> list[tuple[dict, dict]]:
        """(input values, result) of every finished row, in input order."""
        rows = self._db.execute("SELECT * FROM batch_results WHERE run_id=? ORDER BY row_index", (run_id,))
        return [(json.loads(r["input"]), {"output": r["output"], "eos_reason": r["eos_reason"],
                                          "new_tokens": r["new_tokens"], "error": r["error"], "index": r["row_index"]})
                for r in rows]

"""What a reply did besides its answer: the tool calls it made (with their results) and how long it thought.

A reply that calls tools runs several rounds: each round's model text ends in one or more calls, each call
is approved, run and answered, and the last round's text is the reply's answer (its message content). The
calls live here, in their own table keyed by the reply's message id, so the message tree stays as it is
(a regenerated reply has its own calls; deleting a chat deletes its calls). Each call row keeps the text
of the round that made it (`preface`, and its thinking apart), so the whole exchange can be shown, sent back
to the model in later turns and exported. A reply's thinking (the `<think>` part of its text) is kept in
its text; this table keeps its token count and time, which the text cannot tell.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from app.core.store import Store

CALL_STATES = ("pending", "running", "done", "error", "denied")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reply_tool_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    round INTEGER NOT NULL,  -- 0-based model round of the reply that made the call
    call_id TEXT NOT NULL,
    server TEXT NOT NULL,
    name TEXT NOT NULL,
    arguments TEXT NOT NULL,  -- JSON object text, as the model wrote it
    preface TEXT NOT NULL,  -- the round's answer text (thinking and the calls' markup removed)
    reasoning TEXT NOT NULL DEFAULT '',  -- the round's thinking
    state TEXT NOT NULL,
    result TEXT NOT NULL DEFAULT ''  -- the tool's answer, or what went wrong
);
CREATE INDEX IF NOT EXISTS reply_tool_calls_by_message ON reply_tool_calls(message_id, id);
CREATE TABLE IF NOT EXISTS reply_thinking (
    message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    tokens INTEGER NOT NULL,
    seconds REAL NOT NULL
)
"""


@dataclass
class ToolCallRecord:
    id: int
    message_id: int
    round: int
    call_id: str
    server: str
    name: str
    arguments: str
    preface: str
    reasoning: str
    state: str
    result: str

    def arguments_dict(self) -> dict:
        """The arguments as a dict ({} when the model wrote something that is not a JSON object)."""
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass
class Thinking:
    tokens: int
    seconds: float


class ReplyTrace:
    """The tool-call and thinking tables, on the store's own connection (same file, same transactions)."""

    def __init__(self, store: Store):
        self._db = store._db  # noqa: SLF001 - one connection per file: WAL writes from one thread
        for statement in filter(str.strip, _SCHEMA.split(";")):
            self._db.execute(statement)

    def add_call(self, message_id: int, round_: int, call_id: str, server: str, name: str, arguments: str,
                 preface: str, reasoning: str = "", state: str = "pending") -> ToolCallRecord:
        if state not in CALL_STATES:
            raise ValueError(f"unknown tool call state {state!r}; expected one of {CALL_STATES}")
        cur = self._db.execute(
            "INSERT INTO reply_tool_calls (message_id, round, call_id, server, name, arguments, preface, reasoning, state)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (message_id, round_, call_id, server, name, arguments, preface, reasoning, state))
        return ToolCallRecord(cur.lastrowid, message_id, round_, call_id, server, name, arguments, preface, reasoning,
                              state, "")

    def finish_call(self, record: ToolCallRecord, state: str, result: str) -> None:
        if state not in CALL_STATES:
            raise ValueError(f"unknown tool call state {state!r}; expected one of {CALL_STATES}")
        record.state, record.result = state, result
        self._db.execute("UPDATE reply_tool_calls SET state=?, result=? WHERE id=?", (state, result, record.id))

    def calls(self, message_id: int) -> list[ToolCallRecord]:
        rows = self._db.execute("SELECT id, message_id, round, call_id, server, name, arguments, preface, reasoning, state, result"
                                " FROM reply_tool_calls WHERE message_id=? ORDER BY id", (message_id,))
        return [ToolCallRecord(*r) for r in rows]

    def copy(self, source_id: int, target_id: int) -> None:
        """Give message `target_id` (a branch's copy) the calls and thinking of `source_id`."""
        self._db.execute(
            "INSERT INTO reply_tool_calls (message_id, round, call_id, server, name, arguments, preface, reasoning,"
            " state, result) SELECT ?, round, call_id, server, name, arguments, preface, reasoning, state, result"
            " FROM reply_tool_calls WHERE message_id=? ORDER BY id", (target_id, source_id))
        self._db.execute("INSERT OR REPLACE INTO reply_thinking (message_id, tokens, seconds)"
                         " SELECT ?, tokens, seconds FROM reply_thinking WHERE message_id=?", (target_id, source_id))

    def set_thinking(self, message_id: int, tokens: int, seconds: float) -> None:
        self._db.execute("INSERT OR REPLACE INTO reply_thinking (message_id, tokens, seconds) VALUES (?, ?, ?)",
                         (message_id, int(tokens), float(seconds)))

    def thinking(self, message_id: int) -> Thinking | None:
        row = self._db.execute("SELECT tokens, seconds FROM reply_thinking WHERE message_id=?", (message_id,)).fetchone()
        return Thinking(row[0], row[1]) if row is not None else None

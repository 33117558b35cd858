"""Chat history in SQLite (WAL): chats, messages, per-chat settings and per-reply stats.

Messages form a tree (each has a parent id): a regenerated reply or an edited message is a sibling of the
one it replaces, so earlier versions stay as alternatives, and a chat shows the path from its root to its
head (`chats.head_id`). "Branch from here" copies the path up to a message into a new chat that records
where it came from (`chats.branch_of`), so either chat can be deleted or exported on its own.

WAL with synchronous=NORMAL makes every commit survive a killed process, so a reply's partial text
saved while it streams (see app.chat.reply_run) is on disk within the save interval; only an OS crash can
lose more. The store is used from one thread (the Qt/asyncio thread) per process.
"""
from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import EllipsisType
from typing import Iterator

import platformdirs

from app.core.chat_settings import ChatSettings
from app.core.store_errors import write_error

SCHEMA_VERSION = 2  # 1: a flat list of messages per chat (migrated on open)

# Reply states; the first four mean "still running" and become "interrupted" when a store is reopened
# after the process that ran them died.
RUNNING_STATES = ("queued", "deferred", "prefill", "streaming")
FINAL_STATES = ("done", "stopped", "error", "interrupted")
REPLY_STATES = RUNNING_STATES + FINAL_STATES
ROLES = ("user", "assistant")


@dataclass
class ReplyStats:
    """What the user sees under a reply, kept after it ends."""

    state: str = "queued"
    progress: float = 0.0  # prefill fraction while state == "prefill"
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    new_tokens: int = 0
    ttft_s: float | None = None  # request sent -> first token event
    tokens_per_s: float | None = None  # from token event timestamps
    eos_reason: str | None = None
    error: str | None = None
    dropped_messages: int = 0  # messages left out of the prompt so it fits the context
    dropped_turns: int = 0  # the whole turns (a user message and its reply) those messages make
    adapters: str | None = None  # JSON [[name, scale], ...] the reply ran with ("[]": base model; None: unknown)

    def adapter_pairs(self) -> list[tuple[str, float]] | None:
        """The adapters and scales as pairs ([] for the base model), None when not recorded."""
        return None if self.adapters is None else [(str(n), float(s)) for n, s in json.loads(self.adapters)]

    def __post_init__(self) -> None:
        if self.state not in REPLY_STATES:
            raise ValueError(f"unknown reply state {self.state!r}; expected one of {REPLY_STATES}")


@dataclass
class Chat:
    id: int
    title: str
    created: float
    updated: float
    settings: ChatSettings = field(default_factory=ChatSettings)
    branch_of: int | None = None  # the message (of another chat) this chat was branched from


@dataclass
class Message:
    id: int
    chat_id: int
    role: str
    content: str
    created: float
    stats: ReplyStats | None = None  # assistant messages only
    parent_id: int | None = None  # the message this one answers or follows; None for a chat's first


_SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: ids stay unique across deletes
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    settings TEXT NOT NULL,
    head_id INTEGER,  -- last message of the path the chat shows (NULL: no messages)
    branch_of INTEGER  -- message id (in another chat) this chat was branched from
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: ids stay unique across deletes
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    created REAL NOT NULL,
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages(chat_id, id);
CREATE INDEX IF NOT EXISTS messages_by_parent ON messages(parent_id);
CREATE TABLE IF NOT EXISTS reply_stats (
    message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    state TEXT NOT NULL,
    progress REAL NOT NULL,
    prompt_tokens INTEGER,
    cached_tokens INTEGER,
    new_tokens INTEGER NOT NULL,
    ttft_s REAL,
    tokens_per_s REAL,
    eos_reason TEXT,
    error TEXT,
    dropped_messages INTEGER NOT NULL DEFAULT 0,
    adapters TEXT,
    dropped_turns INTEGER NOT NULL DEFAULT 0
);
"""
# Schema 1 -> 2: the message tree. Each old message's parent is the one before it in its chat, and each
# chat's head is its last message, so every old chat shows exactly what it showed before.
_MIGRATE_1_TO_2 = """
ALTER TABLE chats ADD COLUMN head_id INTEGER;
ALTER TABLE chats ADD COLUMN branch_of INTEGER;
ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE;
UPDATE messages SET parent_id = (SELECT max(p.id) FROM messages p WHERE p.chat_id = messages.chat_id AND p.id < messages.id);
UPDATE chats SET head_id = (SELECT max(m.id) FROM messages m WHERE m.chat_id = chats.id);
CREATE INDEX IF NOT EXISTS messages_by_parent ON messages(parent_id);
ALTER TABLE reply_stats ADD COLUMN dropped_messages INTEGER NOT NULL DEFAULT 0
"""
_STATS_COLS = [f.name for f in fields(ReplyStats)]
# The path from a chat's head back to its root (ids only); ancestors always have smaller ids.
_PATH = """
WITH RECURSIVE path(id) AS (
    SELECT head_id FROM chats WHERE id = ?1 AND head_id IS NOT NULL
    UNION ALL SELECT m.parent_id FROM messages m JOIN path ON m.id = path.id WHERE m.parent_id IS NOT NULL
)"""


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("pagedeck", appauthor=False))


class Store:
    """One SQLite database file; `Store.open(data_dir)` creates it (and the folder) if needed."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.write_failed: list = []  # callables taking a StoreWriteError
        self._db = sqlite3.connect(self.path, isolation_level=None)  # autocommit; _tx() groups writes
        self._db.row_factory = sqlite3.Row
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise RuntimeError(f"{self.path}: SQLite refused WAL journal mode (got {mode!r})")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RuntimeError(f"{self.path}: schema version {version} is newer than this app ({SCHEMA_VERSION})")
        if version == 0:
            self._script(_SCHEMA)
        elif version == 1:
            self._script(_MIGRATE_1_TO_2)
            with self._tx():  # executescript would commit early, so one statement at a time
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._add_adapters_column()
        self.recovered = self._recover()

    @classmethod
    def open(cls, data_dir: str | Path | None = None) -> "Store":
        folder = Path(data_dir) if data_dir is not None else default_data_dir()
        folder.mkdir(parents=True, exist_ok=True)
        return cls(folder / "pagedeck.sqlite3")

    def close(self) -> None:
        self._db.close()
        self.closed = True

    closed = False  # after close(): views still on screen must not read it (e.g. a theme change's rebuild)

    def _script(self, script: str) -> None:
        """Create or migrate the schema in one transaction (executescript would commit early)."""
        with self._tx():
            for statement in filter(str.strip, script.split(";")):
                self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        """One transaction; a write the disk refuses (full, read-only) is rolled back, raised as
        StoreWriteError and told to the `write_failed` listeners (the window shows it). Inside another
        transaction it joins that one (a module writing beside a store call commits with it)."""
        if self._db.in_transaction:
            yield
            return
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                if self._db.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL)
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            error = write_error(self.path, exc)
            for listener in list(self.write_failed):
                listener(error)
            raise error from exc

    def integrity(self) -> str:
        """SQLite's quick_check: "ok", or what is damaged."""
        return "; ".join(r[0] for r in self._db.execute("PRAGMA quick_check").fetchall())

    def _add_adapters_column(self) -> None:
        """Stores written before replies recorded their adapters (or the turns their prompt left out) get the
        columns; their replies read None (0 turns)."""
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(reply_stats)")}
        if "adapters" not in columns:
            self._db.execute("ALTER TABLE reply_stats ADD COLUMN adapters TEXT")
        if "dropped_turns" not in columns:
            self._db.execute("ALTER TABLE reply_stats ADD COLUMN dropped_turns INTEGER NOT NULL DEFAULT 0")

    def _recover(self) -> list[int]:
        """Replies still 'running' belong to a process that died: mark them interrupted, keep their text."""
        marks = ",".join("?" * len(RUNNING_STATES))
        ids = [r[0] for r in self._db.execute(f"SELECT message_id FROM reply_stats WHERE state IN ({marks})", RUNNING_STATES)]
        if ids:
            with self._tx():
                self._db.executemany("UPDATE reply_stats SET state='interrupted' WHERE message_id=?", [(i,) for i in ids])
        return ids

    # --- chats ---------------------------------------------------------------------------------

    def create_chat(self, title: str = "New chat", settings: ChatSettings | None = None) -> Chat:
        settings = (settings or ChatSettings()).validate()
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO chats (title, created, updated, settings) VALUES (?, ?, ?, ?)",
            (self._title(title), now, now, settings.to_json()),
        )
        return Chat(cur.lastrowid, self._title(title), now, now, settings)

    def chat(self, chat_id: int) -> Chat:
        row = self._db.execute("SELECT * FROM chats WHERE id=?", (chat_id,)).fetchone()
        if row is None:
            raise KeyError(f"no chat with id {chat_id}")
        return self._chat(row)

    def chats(self, search: str = "") -> list[Chat]:
        """Most recently updated first; `search` matches titles and message text, case-insensitively."""
        if not search:
            rows = self._db.execute("SELECT * FROM chats ORDER BY updated DESC, id DESC")
        else:
            pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self._db.execute(
                "SELECT * FROM chats c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS ("
                " SELECT 1 FROM messages m WHERE m.chat_id = c.id AND m.content LIKE ?1 ESCAPE '\\')"
                " ORDER BY updated DESC, id DESC",
                (pattern,),
            )
        return [self._chat(r) for r in rows]

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._must_change(self._db.execute("UPDATE chats SET title=?, updated=? WHERE id=?", (self._title(title), time.time(), chat_id)), chat_id)

    def set_settings(self, chat_id: int, settings: ChatSettings) -> None:
        settings.validate()
        self._must_change(self._db.execute("UPDATE chats SET settings=? WHERE id=?", (settings.to_json(), chat_id)), chat_id)

    def delete_chat(self, chat_id: int) -> None:
        with self._tx():
            self._must_change(self._db.execute("DELETE FROM chats WHERE id=?", (chat_id,)), chat_id)

    # --- messages ------------------------------------------------------------------------------

    def add_message(self, chat_id: int, role: str, content: str, stats: ReplyStats | None = None,
                    parent_id: int | None | EllipsisType = ...) -> Message:
        """Append a message under `parent_id` (default: the chat's head) and make it the chat's head."""
        if role not in ROLES:
            raise ValueError(f"unknown message role {role!r}; expected one of {ROLES}")
        if stats is not None and role != "assistant":
            raise ValueError("only assistant messages carry reply stats")
        if role == "assistant" and stats is None:
            stats = ReplyStats()
        now = time.time()
        with self._tx():
            if parent_id is ...:
                row = self._db.execute("SELECT head_id FROM chats WHERE id=?", (chat_id,)).fetchone()
                parent_id = row[0] if row is not None else None
            elif parent_id is not None:
                self._check_in_chat(chat_id, parent_id)
            cur = self._db.execute(
                "INSERT INTO messages (chat_id, role, content, created, parent_id) VALUES (?, ?, ?, ?, ?)",
                (chat_id, role, content, now, parent_id),
            )
            if stats is not None:
                self._write_stats(cur.lastrowid, stats)
            self._db.execute("UPDATE chats SET updated=?, head_id=? WHERE id=?", (now, cur.lastrowid, chat_id))
        return Message(cur.lastrowid, chat_id, role, content, now, stats, parent_id)

    def messages(self, chat_id: int) -> list[Message]:
        """The path the chat shows: its first message to its head."""
        rows = self._db.execute(
            f"{_PATH} SELECT m.*, s.* FROM path JOIN messages m ON m.id = path.id"
            " LEFT JOIN reply_stats s ON s.message_id = m.id ORDER BY m.id",
            (chat_id,),
        )
        return [self._message(r) for r in rows]

    def message(self, message_id: int) -> Message:
        row = self._db.execute("SELECT m.*, s.* FROM messages m LEFT JOIN reply_stats s ON s.message_id = m.id"
                               " WHERE m.id=?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(f"no message with id {message_id}")
        return self._message(row)

    def alternatives(self, message_id: int) -> list[int]:
        """Ids of the versions of a message (itself and its siblings: same chat, parent and role), oldest first."""
        m = self.message(message_id)
        rows = self._db.execute(
            "SELECT id FROM messages WHERE chat_id=? AND role=? AND parent_id IS ? ORDER BY id",
            (m.chat_id, m.role, m.parent_id))
        return [r[0] for r in rows]

    def select(self, chat_id: int, message_id: int) -> None:
        """Show the path through `message_id`: the head becomes its latest descendant (newest child each step)."""
        self._check_in_chat(chat_id, message_id)
        head = message_id
        while (row := self._db.execute("SELECT max(id) FROM messages WHERE parent_id=?", (head,)).fetchone())[0]:
            head = row[0]
        self._db.execute("UPDATE chats SET head_id=? WHERE id=?", (head, chat_id))

    def branch(self, chat_id: int, message_id: int, title: str | None = None) -> Chat:
        """A new chat holding a copy of the path up to (and including) `message_id`, with the same settings."""
        self._check_in_chat(chat_id, message_id)
        source = self.chat(chat_id)
        path = [m for m in self._path_to(message_id)]
        now = time.time()
        with self._tx():
            cur = self._db.execute(
                "INSERT INTO chats (title, created, updated, settings, branch_of) VALUES (?, ?, ?, ?, ?)",
                (self._title(title or f"{source.title} (branch)"), now, now, source.settings.to_json(), message_id))
            new_id, parent = cur.lastrowid, None
            for m in path:
                parent = self._db.execute(
                    "INSERT INTO messages (chat_id, role, content, created, parent_id) VALUES (?, ?, ?, ?, ?)",
                    (new_id, m.role, m.content, m.created, parent)).lastrowid
                if m.stats is not None:
                    self._write_stats(parent, m.stats)
            self._db.execute("UPDATE chats SET head_id=? WHERE id=?", (parent, new_id))
        return self.chat(new_id)

    def update_reply(self, message_id: int, content: str, stats: ReplyStats) -> None:
        """Save a reply's text and stats in one commit (called while streaming and when it ends)."""
        self.update_replies({message_id: (content, stats)})

    def update_replies(self, replies: dict[int, tuple[str, ReplyStats]]) -> None:
        with self._tx():
            for message_id, (content, stats) in replies.items():
                self._must_change(self._db.execute("UPDATE messages SET content=? WHERE id=?", (content, message_id)), message_id, "message")
                self._write_stats(message_id, stats)

    # --- helpers -------------------------------------------------------------------------------

    def _write_stats(self, message_id: int, stats: ReplyStats) -> None:
        stats = replace(stats)  # re-runs the state check
        cols = ", ".join(_STATS_COLS)
        marks = ", ".join("?" * len(_STATS_COLS))
        self._db.execute(
            f"INSERT OR REPLACE INTO reply_stats (message_id, {cols}) VALUES (?, {marks})",
            (message_id, *(getattr(stats, c) for c in _STATS_COLS)),
        )

    @staticmethod
    def _title(title: str) -> str:
        title = " ".join(str(title).split())
        if not title:
            raise ValueError("chat title must not be empty")
        return title[:200]

    def _path_to(self, message_id: int) -> list[Message]:
        path = [self.message(message_id)]
        while path[-1].parent_id is not None:
            path.append(self.message(path[-1].parent_id))
        return path[::-1]

    def _check_in_chat(self, chat_id: int, message_id: int) -> None:
        row = self._db.execute("SELECT chat_id FROM messages WHERE id=?", (message_id,)).fetchone()
        if row is None or row[0] != chat_id:
            raise KeyError(f"no message with id {message_id} in chat {chat_id}")

    @staticmethod
    def _message(r: sqlite3.Row) -> Message:
        stats = ReplyStats(**{k: r[k] for k in _STATS_COLS}) if r["state"] is not None else None
        return Message(r["id"], r["chat_id"], r["role"], r["content"], r["created"], stats, r["parent_id"])

    @staticmethod
    def _chat(row: sqlite3.Row) -> Chat:
        return Chat(row["id"], row["title"], row["created"], row["updated"], ChatSettings.from_json(row["settings"]),
                    row["branch_of"])

    @staticmethod
    def _must_change(cur: sqlite3.Cursor, key: int, what: str = "chat") -> None:
        if cur.rowcount == 0:
            raise KeyError(f"no {what} with id {key}")

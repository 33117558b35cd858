"""Messages waiting for their chat's reply to end, kept in the history database.

A message sent while its chat is still replying is not refused: it waits in that chat's queue (oldest
first), can be edited or cancelled while it waits, and is sent when the reply ends. The queue is a table
of its own beside the store's (created if missing, never part of the store's schema version), rows
deleted with their chat, so a queue survives a restart: the reopened chat sends what was waiting.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from app.core.store import Store

_TABLE = """
CREATE TABLE IF NOT EXISTS queued_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    content TEXT NOT NULL,
    created REAL NOT NULL
)"""


@dataclass(frozen=True)
class QueuedMessage:
    id: int
    chat_id: int
    content: str


class MessageQueue:
    """The queued messages of every chat in one store (one table, one connection: the store's)."""

    def __init__(self, store: Store):
        self._db = store._db  # the store's own connection: same file, same thread, same transactions
        self._db.execute(_TABLE)

    def add(self, chat_id: int, content: str) -> QueuedMessage:
        if not content.strip():
            raise ValueError("cannot queue an empty message")
        cur = self._db.execute("INSERT INTO queued_messages (chat_id, content, created) VALUES (?, ?, ?)",
                               (chat_id, content, time.time()))
        return QueuedMessage(cur.lastrowid, chat_id, content)

    def items(self, chat_id: int) -> list[QueuedMessage]:
        """This chat's queue, the next to send first."""
        rows = self._db.execute("SELECT id, chat_id, content FROM queued_messages WHERE chat_id=? ORDER BY id",
                                (chat_id,))
        return [QueuedMessage(*r) for r in rows]

    def edit(self, item_id: int, content: str) -> None:
        if not content.strip():
            raise ValueError("a queued message cannot be empty: cancel it instead")
        if self._db.execute("UPDATE queued_messages SET content=? WHERE id=?", (content, item_id)).rowcount == 0:
            raise KeyError(f"no queued message with id {item_id} (it was sent or cancelled)")

    def remove(self, item_id: int) -> bool:
        """Cancel a queued message; False if it was already sent or cancelled."""
        return self._db.execute("DELETE FROM queued_messages WHERE id=?", (item_id,)).rowcount > 0

    def pop(self, chat_id: int) -> QueuedMessage | None:
        """Take the next message of this chat's queue (None when it is empty)."""
        items = self.items(chat_id)
        if not items:
            return None
        self.remove(items[0].id)
        return items[0]

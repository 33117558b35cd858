"""Documents pinned to chats: their text sits in the prompt as a prefix every pinning chat shares.

A pinned document's text goes at the very start of the system message, before the chat's own system
prompt, wrapped the same way in every chat (`document_prefix`), so two chats that pin the same document
have identical prompt tokens up to its end: the generator's page table names pages by a hash of their
tokens, and the second chat's prompt maps onto the first one's cache pages instead of computing them
again (only its own system prompt and history are new). Documents are ordered by name and text, so
the order they were pinned in does not change the prefix. Text comes from plain files (UTF-8) or, for
PDFs, from pypdf's text extraction. The table lives beside the store's, rows deleted with their chat.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from app.core.store import ChatSettings, Store

_TABLE = """
CREATE TABLE IF NOT EXISTS pinned_documents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    content TEXT NOT NULL,
    created REAL NOT NULL
)"""
MAX_DOCUMENT_CHARS = 2_000_000  # far past any context; beyond it reading the file is the mistake


class DocumentError(ValueError):
    """A document that cannot be pinned; the message names the file and the reason."""


@dataclass(frozen=True)
class PinnedDocument:
    id: int
    chat_id: int
    name: str
    content: str


def read_document(path: str | Path) -> tuple[str, str]:
    """(name, text) of a text or PDF file; DocumentError when it has no text or is not readable."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".pdf":
            from pypdf import PdfReader

            text = "\n\n".join((page.extract_text() or "").strip() for page in PdfReader(path).pages).strip()
        else:
            text = path.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise DocumentError(f"{path.name}: not a UTF-8 text file (pin a text or PDF document)") from None
    except Exception as exc:  # noqa: BLE001 - any reader failure becomes one clear message
        raise DocumentError(f"{path.name}: could not read it: {type(exc).__name__}: {exc}") from None
    if not text:
        raise DocumentError(f"{path.name}: has no text to pin (a scanned PDF needs OCR first)")
    if len(text) > MAX_DOCUMENT_CHARS:
        raise DocumentError(f"{path.name}: {len(text):,} characters is more than any model's context")
    return path.name, text


def document_prefix(docs: list[PinnedDocument]) -> str:
    """The text the documents put before the system prompt (the same for the same documents in any chat)."""
    ordered = sorted(docs, key=lambda d: (d.name, d.content))
    return "".join(f"<document name=\"{d.name}\">\n{d.content}\n</document>\n\n" for d in ordered)


def with_documents(settings: ChatSettings, docs: list[PinnedDocument]) -> ChatSettings:
    """The chat's settings as its prompt sees them: the documents first in the system message."""
    if not docs:
        return settings
    return replace(settings, system_prompt=document_prefix(docs) + settings.system_prompt)


class PinnedDocuments:
    """Every chat's pinned documents in one store (the store's connection)."""

    def __init__(self, store: Store):
        self._db = store._db  # the store's own connection: same file, same thread
        self._db.execute(_TABLE)

    def pin(self, chat_id: int, name: str, content: str) -> PinnedDocument:
        if any(d.name == name and d.content == content for d in self.of(chat_id)):
            raise DocumentError(f"{name} is already pinned to this chat")
        cur = self._db.execute("INSERT INTO pinned_documents (chat_id, name, content, created) VALUES (?, ?, ?, ?)",
                               (chat_id, name, content, time.time()))
        return PinnedDocument(cur.lastrowid, chat_id, name, content)

    def of(self, chat_id: int) -> list[PinnedDocument]:
        rows = self._db.execute("SELECT id, chat_id, name, content FROM pinned_documents WHERE chat_id=? ORDER BY id",
                                (chat_id,))
        return [PinnedDocument(*r) for r in rows]

    def unpin(self, doc_id: int) -> bool:
        return self._db.execute("DELETE FROM pinned_documents WHERE id=?", (doc_id,)).rowcount > 0

    def copy(self, from_chat: int, to_chat: int) -> None:
        """A branch keeps its source's documents."""
        for d in self.of(from_chat):
            self.pin(to_chat, d.name, d.content)

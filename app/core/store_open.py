"""open_history: the history database as the app opens it: one instance per data folder, and a damaged or
read-only file never overwritten.

- Another pagedeck on the same folder: AlreadyRunning (app.core.instance_lock), before SQLite is touched.
- Locked by some other program (SQLite's own lock, beyond the busy timeout), or a schema newer than this
  app: HistoryUnavailable, the file untouched.
- Damaged (not a database, truncated, malformed: SQLite's quick_check fails): the file and its -wal/-shm
  are moved aside to `pagedeck.sqlite3.damaged-<time>` (never written to, never deleted: the user's
  copy for recovery tools), a new empty history starts, and the notice says where the old one is.
- Read-only (file or folder): the file is left as it is and this session's chats go to a temporary
  database; the notice says so.
"""
from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app.core.instance_lock import InstanceLock
from app.core.store import Store, default_data_dir

DB_FILE = "pagedeck.sqlite3"
DAMAGED = ("not a database", "malformed", "corrupt", "quick_check", "disk i/o error", "unsupported file format")


class HistoryUnavailable(RuntimeError):
    """The history can't be opened and must not be touched (locked by another program, newer schema)."""


@dataclass
class OpenedHistory:
    store: Store
    lock: InstanceLock
    notice: str | None = None  # what the user must be told (a damaged file moved aside, a read-only file)
    moved_to: Path | None = None


def open_history(data_dir: str | Path | None = None) -> OpenedHistory:
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    lock = InstanceLock(folder).acquire()  # AlreadyRunning: nothing opened
    try:
        return _open(folder / DB_FILE, lock)
    except BaseException:
        lock.release()
        raise


def _open(path: Path, lock: InstanceLock) -> OpenedHistory:
    try:  # as SQLite opens it: read-write, else (silently) read-only, and then every save would fail
        if path.exists():
            os.close(os.open(path, os.O_RDWR))
    except PermissionError as exc:
        return _read_only_session(path, lock, exc)
    try:
        return OpenedHistory(_checked(path), lock)
    except sqlite3.DatabaseError as exc:
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            raise HistoryUnavailable(f"the history database {path} is locked by another program ({exc}); "
                                     f"close it and start pagedeck again") from None
        if _read_only(path, text):
            return _read_only_session(path, lock, exc)
        if not any(word in text for word in DAMAGED):
            raise HistoryUnavailable(f"cannot open the history database {path}: {exc}") from None
        moved = move_aside(path)
        store = _checked(path)
        return OpenedHistory(store, lock, f"The history database was damaged ({exc}). It was moved to {moved} "
                                          f"(kept untouched, for recovery tools) and a new, empty history was "
                                          f"started.", moved)
    except RuntimeError as exc:  # Store's own refusals: a newer schema, no WAL
        raise HistoryUnavailable(str(exc)) from None


def _checked(path: Path) -> Store:
    store = Store(path)
    try:
        result = store.integrity()
    except sqlite3.DatabaseError:
        store.close()
        raise
    if result != "ok":
        store.close()
        raise sqlite3.DatabaseError(f"quick_check: {result[:200]}")
    return store


def _read_only(path: Path, text: str) -> bool:
    return any(word in text for word in ("readonly", "read-only", "unable to open"))


def _read_only_session(path: Path, lock: InstanceLock, exc: Exception) -> OpenedHistory:
    folder = Path(tempfile.mkdtemp(prefix="pagedeck-unsaved-"))
    store = Store(folder / DB_FILE)
    return OpenedHistory(store, lock, f"The history database {path} can't be written ({exc.__class__.__name__}: "
                                      f"{exc}): it was left as it is. This session's chats are kept in {folder} instead and won't be in "
                                      f"your history; fix the file's permissions and restart pagedeck.")


def move_aside(path: Path) -> Path:
    """Rename the database and its WAL/shared-memory files to `<name>.damaged-<time>[-wal|-shm]`; a name
    already taken gets a counter, so no earlier damaged copy is overwritten."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while any(Path(f"{target}{s}").exists() for s in ("", "-wal", "-shm")):
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            os.rename(src, f"{target}{suffix}")
    return target

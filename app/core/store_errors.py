"""StoreWriteError: the disk refused a history write (full, read-only, I/O error).

SQLite rolled the transaction back, so nothing of that write is on disk and every earlier commit is intact
(WAL). The message says which file and what to do; the window shows it (app.window.store_notice) and the
chats carry on, retrying at their next save.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path


class StoreWriteError(OSError):
    pass


def write_error(path: Path, exc: sqlite3.Error) -> StoreWriteError:
    text = str(exc)
    if "full" in text:
        why = (f"the disk holding {path} is full: the latest changes were not saved (everything saved before is "
               f"intact). Free some space; the next save retries")
    elif "readonly" in text or "read-only" in text:
        why = f"{path} became read-only: the latest changes were not saved (everything saved before is intact)"
    else:
        why = f"saving to {path} failed ({text}): the latest changes were not saved (everything saved before is intact)"
    return StoreWriteError(f"History not saved: {why}")

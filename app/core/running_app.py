"""The running app's status file: what a pagedeck window holds, for `pagedeck ps` to read.

While the app runs it keeps `running.json` in its data folder (app.local.status_file writes it, and
removes it at exit): its pid, the OpenAI API it serves (if any), the replies running, and per model the
memory, pages in use and total, chats and API requests on it. The data folder is the one the app's
history lives in (platformdirs' user data dir, or --data-dir), so `pagedeck ps` finds it the same way
`pagedeck ls` finds the app's model folders. A file whose process is gone (killed before it could remove
it) is stale and read as no app.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from app.core.store import default_data_dir

STATUS_FILE = "running.json"


def status_path(data_dir: str | Path | None = None) -> Path:
    return Path(data_dir or default_data_dir()) / STATUS_FILE


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_running(data_dir: str | Path | None = None) -> dict | None:
    """The running app's status, or None: no file, an unreadable one, or its process has ended."""
    try:
        status = json.loads(status_path(data_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    pid = status.get("pid") if isinstance(status, dict) else None
    if not isinstance(pid, int) or not alive(pid):
        return None
    return status

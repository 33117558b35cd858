"""StatusFile: keeps the data folder's running.json (app.core.running_app) true while the app runs.

Once a second it gathers what the app holds (each model's memory, pages in use and total, the chats and
API requests running on it, the served API's address) and rewrites the file when that changed, through a
temporary file and a rename, so a reader never sees half of it. remove() deletes it at exit.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from PySide6.QtCore import QObject, QTimer

from app.core.running_app import STATUS_FILE

log = logging.getLogger(__name__)

INTERVAL_MS = 1000


class StatusFile(QObject):
    def __init__(self, folder: str | Path, service, server, parent: QObject | None = None,
                 interval_ms: int = INTERVAL_MS):
        super().__init__(parent)
        self.path = Path(folder) / STATUS_FILE
        self.service, self.server = service, server  # EngineService, app.local.local_server.LocalServer
        self.started = time.time()
        self._written: str | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.write)
        self._timer.start()
        self.write()

    def status(self) -> dict:
        s, api = self.service, self.server.server if self.server.running else None
        models = []
        held = ([(s.generator, s.info, True)] if s.generator is not None and s.info is not None else []) + \
               [(slot.generator, slot.info, False) for slot in s.beside.values()]
        for generator, info, main in held:
            m = generator.metrics()
            row = self.server.model_of(generator)
            models.append({"name": info["name"], "path": info.get("path"), "main": main,
                           "memory_bytes": info["memory_bytes"], "pages_used": m["pages_referenced"],
                           "pages_cached": m["pages_cached"], "pages_total": m["pages_total"],
                           "chats_running": s.replies_on(generator),
                           "requests_running": row["requests_running"] if row is not None else 0,
                           "served_as": row["name"] if row is not None else None,
                           "pinned": row["pinned"] if row is not None else None})
        return {"pid": os.getpid(), "started": self.started, "loading": bool(s.loading),
                "server": None if api is None else {"url": api.url, "requests_running": api.requests_running,
                                                    "requests_total": api.requests_total},
                "chats_running": s.replies_on(), "requests_running": api.requests_running if api else 0,
                "models": models}

    def write(self) -> None:
        try:
            text = json.dumps(self.status(), indent=1)
            if text == self._written:
                return
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.path)
            self._written = text
        except Exception as exc:  # noqa: BLE001 - a status file must never disturb the app
            log.warning("could not write %s: %s", self.path, exc)

    def remove(self) -> None:
        self._timer.stop()
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove %s: %s", self.path, exc)

"""RenderScheduler: when each chat pane repaints its streaming reply.

Repaints are paced by one RenderScheduler for all panes: a streaming pane re-renders at most
MAX_RENDER_HZ (less often if its renders get slow), hidden panes not at all (they catch up when shown),
and a tick stops rendering once it has spent its time budget, so eight streaming panes never stall the
UI thread in one go.
"""
from __future__ import annotations

import time
from typing import Protocol

from PySide6.QtCore import QObject, QTimer

MAX_RENDER_HZ = 20
TICK_MS = 15
TICK_BUDGET_S = 0.010
RENDER_SHARE_LIMIT = 10  # a pane waits at least 10x its last render time: rendering stays <= ~10% of the thread


class StreamingPane(Protocol):
    """What the scheduler needs of a pane (a ChatPane)."""

    def isVisible(self) -> bool: ...  # noqa: N802

    def render_stream(self) -> None: ...


class RenderScheduler(QObject):
    """Renders dirty panes, the longest-waiting first, within a per-tick time budget."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._dirty: dict[StreamingPane, float] = {}  # pane -> when it became dirty
        self._last: dict[StreamingPane, float] = {}
        self._cost: dict[StreamingPane, float] = {}  # last render's duration: slow panes render less often
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._tick)

    def mark(self, pane: StreamingPane) -> None:
        self._dirty.setdefault(pane, time.perf_counter())
        if not self._timer.isActive():
            self._timer.start()

    def forget(self, pane: StreamingPane) -> None:
        self._dirty.pop(pane, None)
        self._last.pop(pane, None)
        self._cost.pop(pane, None)

    def _tick(self) -> None:
        start = now = time.perf_counter()
        for pane in sorted(self._dirty, key=self._dirty.get):
            if not pane.isVisible():
                continue  # rendered on show
            interval = max(1.0 / MAX_RENDER_HZ, RENDER_SHARE_LIMIT * self._cost.get(pane, 0.0))
            if now - self._last.get(pane, 0.0) < interval:
                continue
            del self._dirty[pane]
            self._last[pane] = now
            pane.render_stream()
            self._cost[pane] = time.perf_counter() - now
            now = time.perf_counter()
            if now - start > TICK_BUDGET_S:
                break
        if not any(p.isVisible() for p in self._dirty):
            self._timer.stop()

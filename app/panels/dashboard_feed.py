"""Which metrics the dashboard shows: the local generator's, or another source's (a remote server's
/metrics), one source at a time. Switching clears the charts, so two sources never share a chart.

A source holding several models (the app's compare mode, a server's model pool) also feeds the
dashboard's model picker (`models`: lists of (key, name)) and is told which model the user picked
(`choose(key)`); only the followed source's list is shown, and only it hears the pick."""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import SignalInstance

from app.panels.dashboard import DashboardDock

LOCAL_TITLE = "Dashboard"  # short: six dock tabs share a small screen's column


class DashboardFeed:
    def __init__(self, dashboard: DashboardDock, local: SignalInstance, models: SignalInstance | None = None,
                 choose: Callable[[object], None] | None = None, listing: Callable[[], list] | None = None):
        self.dashboard, self.local = dashboard, local
        self._local = (models, choose, listing)  # the local models' list, picker and current list
        self.source, self._models, self._choose = local, None, None
        dashboard.model_chosen.connect(self._chosen)
        self._attach(local, models, choose)

    def _attach(self, source: SignalInstance, models: SignalInstance | None, choose) -> None:
        self.source, self._models, self._choose = source, models, choose
        source.connect(self.dashboard.push)
        if models is not None:
            models.connect(self.dashboard.set_models)

    def _chosen(self, key: object) -> None:
        if self._choose is not None:
            self._choose(key)

    def follow(self, source: SignalInstance, title: str, models: SignalInstance | None = None,
               choose: Callable[[object], None] | None = None) -> None:
        """Show `source`'s snapshots from now on, under `title`; `models` lists its models for the picker,
        `choose` hears which one the user picked."""
        self.source.disconnect(self.dashboard.push)
        if self._models is not None:
            self._models.disconnect(self.dashboard.set_models)
        self.dashboard.reset()
        self.dashboard.set_models([])
        self.dashboard.setWindowTitle(title)
        self._attach(source, models, choose)

    def follow_local(self) -> None:
        models, choose, listing = self._local
        self.follow(self.local, LOCAL_TITLE, models, choose)
        if listing is not None:
            self.dashboard.set_models(listing())
            if choose is not None:
                choose(self.dashboard.model_choice.currentData())

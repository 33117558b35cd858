"""Which metrics the dashboard shows: the local generator's, or another source's (a remote server's
/metrics), one source at a time. Switching clears the charts, so two sources never share a chart."""
from __future__ import annotations

from PySide6.QtCore import SignalInstance

from app.panels.dashboard import DashboardDock

LOCAL_TITLE = "Dashboard"  # short: six dock tabs share a small screen's column


class DashboardFeed:
    def __init__(self, dashboard: DashboardDock, local: SignalInstance):
        self.dashboard, self.local = dashboard, local
        self.source = local
        local.connect(dashboard.push)

    def follow(self, source: SignalInstance, title: str) -> None:
        """Show `source`'s snapshots from now on, under `title`."""
        self.source.disconnect(self.dashboard.push)
        self.dashboard.reset()
        self.dashboard.setWindowTitle(title)
        self.source = source
        source.connect(self.dashboard.push)

    def follow_local(self) -> None:
        self.follow(self.local, LOCAL_TITLE)

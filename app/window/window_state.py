"""The session state in its INI file (QSettings), plus the window's dock layout and side rails.

The dock layout is Qt's own byte array, so it is kept here, beside the Qt-free values of app.core.state
(the window's placement among them). Each side's rail choice (app.window.dock_rails: automatic, rail or
open) and the panels a collapsed side reopens are kept beside it.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings

from app.core.state import AppState

STATE_FILE = "state.ini"  # next to the chat history (the data dir), so --data-dir keeps sessions apart


class WindowState(AppState):
    """AppState in an INI file, with the window's geometry and dock state."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        super().__init__(QSettings(str(self.path), QSettings.Format.IniFormat))

    def _bytes(self, key: str) -> QByteArray | None:
        raw = self.settings.value(key)
        return raw if isinstance(raw, QByteArray) and not raw.isEmpty() else None

    def save_layout(self, dock_state: QByteArray, mode: str, tiles: int) -> None:
        self.settings.setValue("window/state", dock_state)
        self.save_view(mode, tiles)

    def dock_state(self) -> QByteArray | None:
        return self._bytes("window/state")

    def rail_choice(self, side: str, known: tuple[str, ...]) -> str:
        """The user's choice for a side's rail, one of `known` (the first, automatic, when unset or unknown)."""
        raw = self.settings.value(f"rails/{side}")
        return raw if raw in known else known[0]

    def rail_docks(self, side: str) -> list[str]:
        """The panels (dock object names) a collapsed side reopens."""
        names = self._json(f"rails/{side}_docks", [])
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    def save_rail(self, side: str, choice: str, docks: list[str]) -> None:
        self.settings.setValue(f"rails/{side}", choice)
        self._set_json(f"rails/{side}_docks", docks)

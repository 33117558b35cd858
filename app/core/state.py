"""What the app remembers between runs: view, open chats, LoRA, model (the window adds its layout).

One owner per fact: the chats themselves live in the Store, recent model paths in the model panel's file;
this keeps only how the last session looked, so that the next start looks the same. Values are checked
on the way in: a stale or hand-edited file falls back to the defaults, never to a crash. Qt-free: the
values live in any key-value store with QSettings' three methods (app.window.window_state gives it the
INI file and adds the window's geometry, which Qt encodes).
"""
from __future__ import annotations

import json
from typing import Any, Protocol


class StateValues(Protocol):
    """Where the values are kept (a QSettings in the app)."""

    def value(self, key: str) -> Any: ...

    def setValue(self, key: str, value: Any) -> None: ...  # noqa: N802 - QSettings' name

    def sync(self) -> None: ...


class AppState:
    """Read and write the last session's state; the window decides what to do with it."""

    def __init__(self, settings: StateValues):
        self.settings = settings

    # --- raw values ------------------------------------------------------------------------------------
    def _json(self, key: str, default: Any) -> Any:
        raw = self.settings.value(key)
        if raw is None:
            return default
        try:
            return json.loads(str(raw))
        except ValueError:
            return default

    def _set_json(self, key: str, value: Any) -> None:
        self.settings.setValue(key, json.dumps(value))

    def sync(self) -> None:
        self.settings.sync()

    # --- window placement --------------------------------------------------------------------------------
    def save_placement(self, x: int, y: int, width: int, height: int, maximized: bool) -> None:
        """Where the window was: its frame's top-left corner (x, y) and its client size."""
        self._set_json("window/placement", {"x": x, "y": y, "width": width, "height": height,
                                            "maximized": maximized})

    def placement(self) -> tuple[int, int, int, int, bool] | None:
        """(x, y, width, height, maximized) as saved, or None (nothing saved, or damaged)."""
        v = self._json("window/placement", None)
        if not isinstance(v, dict):
            return None
        values = [v.get(k) for k in ("x", "y", "width", "height")]
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in values) or min(values[2:]) <= 0:
            return None
        return (*values, v.get("maximized") is True)

    # --- view ----------------------------------------------------------------------------------------
    def save_view(self, mode: str, tiles: int) -> None:
        self._set_json("view", {"mode": mode, "tiles": tiles})

    def view(self) -> tuple[str, int]:
        v = self._json("view", {})
        mode, tiles = (v.get("mode"), v.get("tiles")) if isinstance(v, dict) else (None, None)
        if mode in ("tabs", "tiles") and isinstance(tiles, int) and 2 <= tiles <= 4:
            return mode, tiles
        return "tabs", 2

    # --- chats -----------------------------------------------------------------------------------------
    def save_chats(self, open_ids: list[int], current: int | None) -> None:
        self._set_json("chats", {"open": list(open_ids), "current": current})

    def chats(self) -> tuple[list[int], int | None]:
        """The chat ids open last time (tab order) and the current one."""
        v = self._json("chats", {})
        ids = v.get("open") if isinstance(v, dict) else None
        current = v.get("current") if isinstance(v, dict) else None
        ids = [i for i in ids if isinstance(i, int)] if isinstance(ids, list) else []
        return ids, current if isinstance(current, int) else None

    # --- engine ----------------------------------------------------------------------------------------
    def save_loras(self, pairs: list[tuple[str, float]]) -> None:
        self._set_json("lora/active", [[str(p), float(s)] for p, s in pairs])

    def loras(self) -> list[tuple[str, float]]:
        v = self._json("lora/active", [])
        if not isinstance(v, list):
            return []
        return [(p, float(s)) for p, s in (x for x in v if isinstance(x, list) and len(x) == 2)
                if isinstance(p, str) and isinstance(s, (int, float))]

    def save_lora_folders(self, folders: list[str]) -> None:
        """Folders the LoRA panel scans (the demo folder and those the user added)."""
        self._set_json("lora/folders", [str(f) for f in folders])

    def lora_folders(self) -> list[str]:
        v = self._json("lora/folders", [])
        return [f for f in v if isinstance(f, str)] if isinstance(v, list) else []

    def save_model_options(self, request: dict) -> None:
        """The model panel's choices (shown again at the next start, loaded or not)."""
        self._set_json("model/options", request)

    def model_options(self) -> dict:
        v = self._json("model/options", {})
        return v if isinstance(v, dict) else {}

    def save_last_model(self, request: dict) -> None:
        """The load request of the model that ran last (loaded again at the next start)."""
        self._set_json("model/last", request)

    def last_model(self) -> dict | None:
        v = self._json("model/last", None)
        return v if isinstance(v, dict) else None

"""App-wide preferences (theme, font size, what new chats start with, user presets, each model's prompt
format, the order replies are ranked in) in one QSettings file.

One INI file, never the platform registry, so its location is a path: PAGEDECK_SETTINGS when set (tests
point it into a temporary folder so they never touch a user's settings), else pagedeck.ini in the user
config folder. Each change is written through at once, and every Preferences object on the same path
sees the same values (QSettings shares them inside a process), so dialogs can open their own.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import platformdirs
from PySide6.QtCore import QSettings

from app.core.presets import BUILTIN_PRESETS, DEFAULT_PRESET, apply_preset
from app.core.priorities import KINDS, check_order
from app.core.store import ChatSettings
from engine import envs

THEMES = ("system", "light", "dark")
FONT_SIZES = (6, 40)  # points; 0 means the system's default font size


def settings_path() -> Path:
    if envs.PAGEDECK_SETTINGS is not None:
        return envs.PAGEDECK_SETTINGS
    return Path(platformdirs.user_config_dir("pagedeck", appauthor=False)) / "pagedeck.ini"


class Preferences:
    """Typed, validated access to the app's QSettings file."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else settings_path()

    def qsettings(self) -> QSettings:
        """A QSettings on the file, for one use. None is kept: each is freed (and flushed) on the calling
        thread at once, never later by the garbage collector on whatever thread it runs."""
        return QSettings(str(self.path), QSettings.Format.IniFormat)

    def _get(self, key: str, default: Any, kind: type) -> Any:
        return self.qsettings().value(key, default, type=kind)

    def _set(self, key: str, value: Any) -> None:
        qs = self.qsettings()
        qs.setValue(key, value)
        qs.sync()
        if qs.status() != QSettings.Status.NoError:
            raise OSError(f"could not write the settings file {self.path} ({qs.status().name})")

    # --- look ----------------------------------------------------------------------------------

    @property
    def theme(self) -> str:
        value = self._get("appearance/theme", "system", str)
        return value if value in THEMES else "system"

    @theme.setter
    def theme(self, value: str) -> None:
        if value not in THEMES:
            raise ValueError(f"theme must be one of {THEMES}, got {value!r}")
        self._set("appearance/theme", value)

    @property
    def font_size(self) -> int:
        value = self._get("appearance/font_size", 0, int)
        return value if value == 0 or FONT_SIZES[0] <= value <= FONT_SIZES[1] else 0

    @font_size.setter
    def font_size(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not (
                value == 0 or FONT_SIZES[0] <= value <= FONT_SIZES[1]):
            raise ValueError(f"font size must be 0 (system default) or {FONT_SIZES[0]}..{FONT_SIZES[1]} pt, "
                             f"got {value!r}")
        self._set("appearance/font_size", value)

    # --- new chats -----------------------------------------------------------------------------

    @property
    def system_prompt(self) -> str:
        """The system prompt new chats start with."""
        return self._get("new_chat/system_prompt", ChatSettings().system_prompt, str)

    @system_prompt.setter
    def system_prompt(self, value: str) -> None:
        if not isinstance(value, str):
            raise ValueError(f"system prompt must be a string, got {value!r}")
        self._set("new_chat/system_prompt", value)

    @property
    def preset(self) -> str:
        """The sampler preset new chats start with (the default one if it was deleted)."""
        name = self._get("new_chat/preset", DEFAULT_PRESET, str)
        return name if name in self.presets() else DEFAULT_PRESET

    @preset.setter
    def preset(self, name: str) -> None:
        if name not in self.presets():
            raise ValueError(f"no preset named {name!r}")
        self._set("new_chat/preset", name)

    def new_chat_settings(self) -> ChatSettings:
        """The settings a new chat starts with: the default system prompt and preset."""
        return apply_preset(ChatSettings(system_prompt=self.system_prompt), self.presets()[self.preset])

    # --- reply ranks ---------------------------------------------------------------------------

    @property
    def reply_order(self) -> tuple[str, ...]:
        """The kinds of replies (app.core.priorities.KINDS), the first kept first when the cache runs short;
        a hand-edited value that does not name each kind once reads as the default."""
        raw = self._get("replies/order", ",".join(KINDS), str)
        try:
            return check_order(k.strip() for k in raw.split(",") if k.strip())
        except ValueError:
            return KINDS

    @reply_order.setter
    def reply_order(self, order) -> None:
        self._set("replies/order", ",".join(check_order(order)))

    # --- presets -------------------------------------------------------------------------------

    def user_presets(self) -> dict[str, dict[str, Any]]:
        raw = self._get("presets/user", "{}", str)
        try:
            presets = json.loads(raw)
        except json.JSONDecodeError:
            return {}
        out = {}
        for name, values in presets.items() if isinstance(presets, dict) else ():
            try:  # a hand-edited or older entry that no longer validates is skipped, not fatal
                apply_preset(ChatSettings(), values)
            except (TypeError, ValueError):
                continue
            out[name] = values
        return out

    def presets(self) -> dict[str, dict[str, Any]]:
        """Built-ins first, then the user's, by name."""
        return {**BUILTIN_PRESETS, **self.user_presets()}

    def save_preset(self, name: str, values: dict[str, Any]) -> None:
        name = " ".join(str(name).split())
        if not name:
            raise ValueError("a preset needs a name")
        if name in BUILTIN_PRESETS:
            raise ValueError(f"{name!r} is a built-in preset; choose another name")
        apply_preset(ChatSettings(), values)  # validates
        presets = self.user_presets()
        presets[name] = dict(values)
        self._set("presets/user", json.dumps(presets))

    def delete_preset(self, name: str) -> None:
        presets = self.user_presets()
        if name not in presets:
            raise KeyError(f"no user preset named {name!r}")
        del presets[name]
        self._set("presets/user", json.dumps(presets))

    # --- prompt formats ------------------------------------------------------------------------

    def chat_templates(self) -> dict[str, str]:
        """Model -> the prompt format chosen for it (engine.check_chat_format's choices); models not listed
        follow the automatic rule."""
        try:
            chosen = json.loads(self._get("models/chat_templates", "{}", str))
        except json.JSONDecodeError:
            return {}
        return {k: v for k, v in chosen.items() if isinstance(k, str) and isinstance(v, str)} \
            if isinstance(chosen, dict) else {}

    def chat_template_for(self, model: str | None) -> str:
        """The prompt format chosen for a model (its path; None: the embedded default), "auto" if none was."""
        return self.chat_templates().get(model_key(model), "auto")

    def set_chat_template_for(self, model: str | None, choice: str) -> None:
        """Remember a model's prompt format ("auto" forgets the choice)."""
        if not isinstance(choice, str) or not choice:
            raise ValueError(f"a prompt format choice is a non-empty string, got {choice!r}")
        chosen = self.chat_templates()
        chosen.pop(model_key(model), None)
        if choice != "auto":
            chosen[model_key(model)] = choice
        self._set("models/chat_templates", json.dumps(chosen))


def model_key(model: str | None) -> str:
    """How a model is named in the preferences: its resolved path, or "default" for the embedded model."""
    return str(Path(model).expanduser().resolve()) if model else "default"

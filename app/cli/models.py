"""The models the CLI knows by name: engine.find_models over the usual places plus the folders added in the
Model tab (model_folders.json in the app's data folder), and a name or path turned into one of them."""
from __future__ import annotations

import json
from pathlib import Path

from app.core.store import default_data_dir

FOLDERS_FILE = "model_folders.json"  # the Model tab's "Add folder…" list (app.panels.model_browser)
DEFAULT = "default"  # the embedded SmolLM2-135M-Instruct


def added_folders(data_dir: Path | None = None) -> list[str]:
    """The folders the user added in the Model tab; [] when there are none or the file is unreadable."""
    path = Path(data_dir or default_data_dir()) / FOLDERS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [f for f in data.get("folders", []) if isinstance(f, str)]
    except (OSError, ValueError, AttributeError):
        return []


def find(data_dir: Path | None = None, folders: list[str] = (), cache_tokens: int = 8192) -> list:
    """engine.find_models with the added folders, estimated for `cache_tokens` as the Model tab does."""
    import engine

    return engine.find_models(added_folders(data_dir) + list(folders), cache_tokens=cache_tokens)


def resolve(name: str, found: list) -> object:
    """The found model `name` means: its exact name, else the one whose name ends with it or contains it
    (case-insensitive) when only one does. Raises LookupError saying what matched."""
    exact = [m for m in found if m.name == name]
    if exact:
        return exact[0]
    low = name.lower()
    for test in (lambda n: n.endswith(low) or n.endswith(low + ".gguf"), lambda n: low in n):
        hits = [m for m in found if test(m.name.lower())]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            names = ", ".join(m.name for m in hits[:5]) + (", …" if len(hits) > 5 else "")
            raise LookupError(f"{name!r} matches {len(hits)} models ({names}); give more of the name")
    raise LookupError(f"no model called {name!r}; `pagedeck ls` lists them, `pagedeck get REPO` downloads one")

"""Which tools the user chose to "always allow": their calls run without asking again.

Kept as a JSON list of "server/tool" keys beside mcp.json, so the choice survives restarts and is
forgotten by deleting one file.
"""
from __future__ import annotations

import json
from pathlib import Path

from app.agent.mcp_config import config_dir

APPROVALS_NAME = "mcp_approvals.json"


class ToolApprovals:
    def __init__(self, path: Path | None = None):
        self.path = path or config_dir() / APPROVALS_NAME
        self._allowed: set[str] = set()
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self._allowed = {k for k in data.get("always_allow", []) if isinstance(k, str)}
            except (json.JSONDecodeError, AttributeError):
                self._allowed = set()  # a broken file asks again, which is the safe side

    def always_allowed(self, key: str) -> bool:
        return key in self._allowed

    def allow_always(self, key: str) -> None:
        self._allowed.add(key)
        self._save()

    def revoke(self, key: str) -> None:
        self._allowed.discard(key)
        self._save()

    @property
    def keys(self) -> list[str]:
        return sorted(self._allowed)

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"always_allow": sorted(self._allowed)}, indent=2) + "\n", encoding="utf-8")

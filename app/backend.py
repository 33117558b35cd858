"""Backend: what a chat needs from whatever generates its replies, and the switch between local and remote.

ChatSession talks only to this protocol, so it never asks where a reply comes from: EngineService runs
it on the in-process generator, RemoteBackend streams it from an OpenAI-compatible server. A job is an
async iterator of engine-style result dicts (see ARCHITECTURE.md, "Generator results").
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Protocol

from app.store import ChatSettings


class Backend(Protocol):
    async def wait_loaded(self) -> None:
        """Return once replies can start (a model is loaded / the server is connected)."""

    def start_job(self, identifier: Any, history: list[dict], settings: ChatSettings) -> tuple[AsyncIterator[dict], int | None]:
        """Start one reply: (its results, prompt token count if known now). Runs on the event loop."""

    async def cancel(self, identifier: Any) -> bool:
        """Stop a chat's reply; False if it has none. The backend has let go of it when this returns."""

    def job_ended(self, identifier: Any) -> None:
        """The chat consumed its reply's last result."""


class BackendSwitch:
    """The Backend the chats hold: forwards to the current one; a running reply stays with its own."""

    def __init__(self, backend: Backend):
        self.current = backend
        self._owner: dict[Any, Backend] = {}

    def use(self, backend: Backend) -> None:
        """Send new replies to `backend` (replies already running finish where they are)."""
        self.current = backend

    async def wait_loaded(self) -> None:
        await self.current.wait_loaded()

    def start_job(self, identifier: Any, history: list[dict], settings: ChatSettings):
        backend = self.current
        out = backend.start_job(identifier, history, settings)
        self._owner[identifier] = backend
        return out

    async def cancel(self, identifier: Any) -> bool:
        backend = self._owner.get(identifier, self.current)
        return await backend.cancel(identifier)

    def job_ended(self, identifier: Any) -> None:
        backend = self._owner.pop(identifier, self.current)
        backend.job_ended(identifier)

"""Backend: what a chat needs from whatever generates its replies, and the switch between local and remote.

ChatSession talks only to this protocol, so it never asks where a reply comes from: EngineService runs
it on the in-process generator, RemoteBackend streams it from an OpenAI-compatible server. A job is an
async iterator of engine-style result dicts (see ARCHITECTURE.md, "Generator results").
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Protocol

from app.core.store import ChatSettings


class Backend(Protocol):
    continues_replies: bool
    """True where a trailing assistant message is continued (a remote chat API would answer it with a new
    turn, so Continue is off there)."""

    runs_tools: bool
    """True where start_job takes `tools` (OpenAI-style function entries) and the chat runs the reply's
    calls: the local engine's replies hold them as text in the model's own format; a remote server parses
    them itself and a round's last result carries them complete (`tool_calls`)."""

    ranks_replies: bool
    """True where replies are ranked (app.core.priorities: the focused chat first) and focus_chat re-ranks
    the running ones; a remote server schedules by its own rules (False there: the order does not apply)."""

    def focus_chat(self, chat_id: Any, compared: Any = ()) -> None:
        """Optional, where ranks_replies: the chat the user looks at now and those compared beside it."""

    def chat_template(self, settings: ChatSettings | None = None) -> str | None:
        """The model's chat template source, where known (None: a remote server, no model)."""

    def render_prompt(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> str | None:
        """The prompt's text for that history, where the backend renders it (None: a remote server)."""

    async def wait_loaded(self) -> None:
        """Return once replies can start (a model is loaded / the server is connected)."""

    def start_job(self, identifier: Any, history: list[dict], settings: ChatSettings,
                  **tools: Any) -> tuple[AsyncIterator[dict], int | None]:
        """Start one reply: (its results, prompt token count if known now). Runs on the event loop.
        `tools=[...]` only where runs_tools."""

    async def cancel(self, identifier: Any) -> bool:
        """Stop a chat's reply; False if it has none. The backend has let go of it when this returns."""

    def job_ended(self, identifier: Any) -> None:
        """The chat consumed its reply's last result."""

    def context_limit(self, settings: ChatSettings | None = None) -> int | None:
        """The most tokens one sequence may hold (prompt + reply) on the model `settings` name (None: the
        main one); None if unknown (no model, a remote server): the chat is then sent as it is."""

    def count_tokens(self, history: list[dict], settings: ChatSettings, **tools: Any) -> int | None:
        """Prompt tokens of that history (a trailing assistant message is continued, not closed); None
        where the backend cannot count (no model loaded, a remote server)."""

    def adapter_names(self) -> list[str]:
        """LoRA adapters a chat may name in its settings (the loaded ones)."""

    def prompt_format(self) -> dict | None:
        """The prompt format chats are rendered with ({"label", "short", ...}, see
        EngineService.chat_format_info); None where unknown (no model, a remote server)."""

    def sees_images(self, settings: ChatSettings | None = None) -> bool | None:
        """Whether the chat's model sees images (history entries' `images`, app.core.images); None where
        unknown (a remote server answers a text-only model's images with an error of its own)."""

    def image_tokens(self, image: Any, settings: ChatSettings | None = None) -> int | None:
        """Prompt tokens one attached image (app.core.images.AttachedImage) costs; None when unknown."""

    async def prepare_images(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> None:
        """Optional: encode the history's images off the event loop before count_tokens and start_job read
        its prompt (a local vision model; the encoder's errors are raised)."""


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

    def start_job(self, identifier: Any, history: list[dict], settings: ChatSettings, **tools: Any):
        backend = self.current
        out = backend.start_job(identifier, history, settings, **tools)
        self._owner[identifier] = backend
        return out

    async def cancel(self, identifier: Any) -> bool:
        backend = self._owner.get(identifier, self.current)
        return await backend.cancel(identifier)

    def job_ended(self, identifier: Any) -> None:
        backend = self._owner.pop(identifier, self.current)
        backend.job_ended(identifier)

    @property
    def continues_replies(self) -> bool:
        return self.current.continues_replies

    @property
    def ranks_replies(self) -> bool:
        return bool(getattr(self.current, "ranks_replies", False))

    def focus_chat(self, chat_id: Any, compared: Any = ()) -> None:
        """Tell every backend that ranks (the current one, and those still running replies) the new focus."""
        for backend in {id(b): b for b in [self.current, *self._owner.values()]}.values():
            if getattr(backend, "ranks_replies", False):
                backend.focus_chat(chat_id, compared)

    def context_limit(self, settings: ChatSettings | None = None) -> int | None:
        return self.current.context_limit(settings)

    def count_tokens(self, history: list[dict], settings: ChatSettings, **tools: Any) -> int | None:
        return self.current.count_tokens(history, settings, **tools)

    @property
    def runs_tools(self) -> bool:
        return self.current.runs_tools

    def chat_template(self, settings: ChatSettings | None = None) -> str | None:
        return self.current.chat_template(settings)

    def render_prompt(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> str | None:
        return self.current.render_prompt(history, settings, tools)

    def adapter_names(self) -> list[str]:
        return self.current.adapter_names()

    def prompt_format(self) -> dict | None:
        return self.current.prompt_format()

    def sees_images(self, settings: ChatSettings | None = None) -> bool | None:
        fn = getattr(self.current, "sees_images", None)
        return fn(settings) if fn is not None else None

    def image_tokens(self, image: Any, settings: ChatSettings | None = None) -> int | None:
        fn = getattr(self.current, "image_tokens", None)
        return fn(image, settings) if fn is not None else None

    async def prepare_images(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> None:
        fn = getattr(self.current, "prepare_images", None)
        if fn is not None:
            await fn(history, settings, tools)

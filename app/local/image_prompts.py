"""Prompts of chats with images, made off the event loop.

A history with images on a model that sees them becomes (ids, image embeddings) through
app.local.chat_prompt.image_prompt: each image decoded, hashed, resized into the encoder's tiles and run
through the vision encoder. On a CPU that takes from a fraction of a second to many seconds for a big
picture, so it must not run on the Qt event loop (the window would freeze, and every other chat's
stream with it). A reply therefore first awaits `prepare`, which makes the prompt on a worker thread
(asyncio.to_thread, as the engine service loads models) and keeps it; the synchronous calls that follow
on the loop (the context fit's token count, start_job) find it here and only read it, so the job starts
after its embeddings exist.

Cancelling the awaiting reply (Stop, closing the chat) returns at once; the worker finishes its image in
the background and its result is kept for a later send. An encoder error is raised to the reply (shown
under it). A history that is not the one prepared (the context fit dropping old turns) is made on the
loop as before; its images were encoded by then (the engine keeps recent images' embeddings), so only
the decode and the hash run there. Torch-free here: the engine does the work.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from app.local.chat_prompt import image_prompt

__all__ = ["ImagePrompts"]


@dataclass(frozen=True)
class _Made:
    tokenizer: Any
    vision: Any
    history: list[dict]
    system_prompt: str
    thinking: Any
    tools: Any
    prompt: tuple  # (ids, embeddings)

    def matches(self, tokenizer: Any, vision: Any, history: list[dict], settings: Any, tools: Any) -> bool:
        return (self.tokenizer is tokenizer and self.vision is vision and self.system_prompt == settings.system_prompt
                and self.thinking == settings.thinking and self.tools == (tools or None) and self.history == history)


class ImagePrompts:
    """The last few image prompts made, each for one (tokenizer, encoder, history, system prompt, thinking,
    tools)."""

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self._made: list[_Made] = []
        self._lock = threading.Lock()  # workers add prompts while the loop reads them

    def get(self, tokenizer: Any, vision: Any, history: list[dict], settings: Any, tools: Any = None) -> tuple | None:
        with self._lock:
            for made in reversed(self._made):
                if made.matches(tokenizer, vision, history, settings, tools):
                    return made.prompt
        return None

    def _make(self, tokenizer: Any, vision: Any, history: list[dict], settings: Any, tools: Any) -> tuple:
        history = [dict(entry) for entry in history]  # the caller's list may grow (tool rounds) meanwhile
        prompt = image_prompt(tokenizer, vision, history, settings, tools)
        with self._lock:
            self._made.append(_Made(tokenizer, vision, history, settings.system_prompt, settings.thinking,
                                    tools or None, prompt))
            del self._made[:-self.capacity]
        return prompt

    async def prepare(self, tokenizer: Any, vision: Any, history: list[dict], settings: Any, tools: Any = None) -> None:
        """Make the prompt on a worker thread (nothing when it is made already); the encoder's errors are raised."""
        if self.get(tokenizer, vision, history, settings, tools) is None:
            await asyncio.to_thread(self._make, tokenizer, vision, list(history), settings, tools)

    def of(self, tokenizer: Any, vision: Any, history: list[dict], settings: Any, tools: Any = None) -> tuple:
        """(ids, embeddings): the prepared prompt, else made here (on the caller's thread)."""
        made = self.get(tokenizer, vision, history, settings, tools)
        return made if made is not None else self._make(tokenizer, vision, history, settings, tools)

    def clear(self) -> None:
        with self._lock:
            self._made.clear()

"""Fitting a chat into the model's context: which turns go into the prompt and how long the reply may be.

The engine refuses prompt + max_new_tokens beyond its max_seq_len. So before a reply starts the chat either
drops its oldest turns (the system prompt is not a turn and always stays) until the configured reply length
fits, or, with truncation off, asks only for the room that is left. A reply without a limit (max_new_tokens
None) may fill the context; turns are dropped until REPLY_ROOM tokens (or a quarter of the context) are left
for it. Qt-free: token counting is the backend's (its tokenizer and chat template).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from app.core.store import ChatSettings

TOGGLE_NAME = "Drop oldest turns"  # the chat setting's label, named in the error that suggests it
REPLY_ROOM = 1024  # tokens an unlimited reply is left at least (turns are dropped for it), context permitting


class ContextFull(ValueError):
    """The prompt leaves no room for a reply; the message says what the user can do."""


@dataclass(frozen=True)
class Fit:
    history: list[dict]  # what goes into the prompt
    dropped: int  # oldest messages left out
    prompt_tokens: int
    max_new_tokens: int  # the reply's budget: never past the context


def fit_context(history: list[dict], settings: ChatSettings, count: Callable[[list[dict], ChatSettings], int],
                limit: int) -> Fit:
    """Pick the prompt for `history` under a context of `limit` tokens (see the module docstring)."""
    tokens = count(history, settings)
    dropped = 0
    want = settings.max_new_tokens if settings.max_new_tokens is not None else min(REPLY_ROOM, limit // 4)
    if settings.truncate:
        while limit - tokens < want and _turn_end(history, dropped) < len(history):
            dropped = _turn_end(history, dropped)  # one whole turn at a time, so the prompt starts with a user
            tokens = count(history[dropped:], settings)
    room = limit - tokens
    if room < 1:
        if settings.truncate:
            raise ContextFull(f"the last message alone ({tokens} prompt tokens with the system prompt) fills the "
                              f"model's context of {limit} tokens: shorten it or the system prompt")
        raise ContextFull(f"this chat ({tokens} prompt tokens) fills the model's context of {limit} tokens: turn on "
                          f"\"{TOGGLE_NAME}\" in the chat's settings, branch from an earlier message, or start a new chat")
    return Fit(history[dropped:], dropped, tokens, room if settings.max_new_tokens is None else
               min(settings.max_new_tokens, room))


def _turn_end(history: list[dict], start: int) -> int:
    """Index of the next user message after `start` (the start of the next turn), or len(history)."""
    for i in range(start + 1, len(history)):
        if history[i]["role"] == "user":
            return i
    return len(history)

"""Fitting a chat into the model's context: which turns go into the prompt and how long the reply may be.

The engine refuses prompt + max_new_tokens beyond its max_seq_len. So before a reply starts, the chat's
context overflow policy (ChatSettings.context_overflow, app.core.context_window) picks the turns: with
truncate middle or rolling window, whole turns are left out until the configured reply length fits, and a
reply without a limit (max_new_tokens None) may fill the context, turns being left out until REPLY_ROOM
tokens (or a quarter of the context) are left for it. With stop at limit nothing is left out: the reply
gets the room that is left, and a chat with none left stops with a message saying what to do. The stored
history never changes; only the prompt does. Qt-free: token counting is the backend's (its tokenizer and
chat template).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from app.core.context_window import POLICY_LABELS, ROLLING_WINDOW, STOP_AT_LIMIT, TRUNCATE_MIDDLE, fit_turns
from app.core.store import ChatSettings

SETTING_NAME = "Context overflow"  # the chat setting's label, named in the messages that suggest it
REPLY_ROOM = 1024  # tokens an unlimited reply is left at least (turns are left out for it), context permitting
WHAT_TO_DO = (f"set \"{SETTING_NAME}\" to \"{POLICY_LABELS[TRUNCATE_MIDDLE]}\" or \"{POLICY_LABELS[ROLLING_WINDOW]}\" "
              "in the chat's settings, branch from an earlier message, or start a new chat")


class ContextFull(ValueError):
    """The prompt leaves no room for a reply; the message says what the user can do."""


@dataclass(frozen=True)
class Fit:
    history: list[dict]  # what goes into the prompt
    dropped: int  # messages left out
    dropped_turns: int  # whole turns left out (a user message and its reply)
    prompt_tokens: int
    max_new_tokens: int  # the reply's budget: never past the context
    fills_context: bool  # the budget is all the room left: a reply that uses it has filled the context


def fit_context(history: list[dict], settings: ChatSettings, count: Callable[[list[dict], ChatSettings], int],
                limit: int) -> Fit:
    """Pick the prompt for `history` under a context of `limit` tokens (see the module docstring)."""
    want = settings.max_new_tokens if settings.max_new_tokens is not None else min(REPLY_ROOM, limit // 4)
    window = fit_turns(history, lambda h: count(h, settings), limit - want, settings.context_overflow,
                       pinned=lambda m: bool(m.get("images")))  # a turn's attached images keep it in the middle
    room = limit - window.tokens
    if room < 1:
        raise ContextFull(context_full_message(settings, window.tokens, limit))
    budget = room if settings.max_new_tokens is None else min(settings.max_new_tokens, room)
    return Fit(window.messages(history), window.dropped_messages, window.dropped_turns, window.tokens, budget,
               budget == room)


def context_full_message(settings: ChatSettings, tokens: int, limit: int) -> str:
    """Why no reply fits (`tokens` in the prompt already, a context of `limit`) and what the user can do."""
    if settings.context_overflow == STOP_AT_LIMIT:
        return (f"the context is full: this chat's prompt ({tokens} tokens) fills the model's context of {limit} "
                f"tokens. To go on, {WHAT_TO_DO}")
    return (f"the context is full: the last message alone ({tokens} prompt tokens with the system prompt and "
            f"pinned documents) fills the model's context of {limit} tokens: shorten it or the system prompt")


def reply_filled_message(limit: int) -> str:
    """A stop-at-limit reply that ran until the context was full: what happened and what to do."""
    return f"the context is full: the reply stopped at the model's context of {limit} tokens. To go on, {WHAT_TO_DO}"

"""Which whole turns of a chat go into a prompt that must fit a token budget: the context overflow policies.

A turn is a user message and what follows it up to the next user message (the reply, its tool calls and
their results); leading system messages are the head, not a turn, and always stay. The latest turn (the
message being answered, or the reply being continued) always stays. Turns are kept or left out whole and
in their order, so the model never sees a reply without its question. The policies are LM Studio's:

- STOP_AT_LIMIT leaves nothing out: a chat that no longer fits stops, and says so.
- TRUNCATE_MIDDLE keeps the first turn (the chat's opening, often the task) and pinned turns (those
  carrying an attachment) and leaves out the turns between them and the latest ones, oldest first; only
  when that middle is gone are pinned turns, then the first turn, left out too.
- ROLLING_WINDOW keeps as many of the latest turns as fit.

Decided over token counts: `count(messages)` is a candidate prompt's length (a real chat template's,
which need not be a sum of per-message counts). For one policy's drop order a prompt with more turns left
out is never longer, so the fewest turns to leave out is found by binary search: O(log turns) counts,
each of a prompt that is the chat less one or two spans (app.local.chat_prompt cuts those from one
tokenization). Pure: no Qt, no tokenizer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

STOP_AT_LIMIT = "stop_at_limit"
TRUNCATE_MIDDLE = "truncate_middle"
ROLLING_WINDOW = "rolling_window"
POLICIES = (TRUNCATE_MIDDLE, ROLLING_WINDOW, STOP_AT_LIMIT)  # (the settings dialog's order; the first is the default)
POLICY_LABELS = {TRUNCATE_MIDDLE: "Truncate middle", ROLLING_WINDOW: "Rolling window", STOP_AT_LIMIT: "Stop at limit"}


@dataclass(frozen=True)
class Window:
    """The messages a prompt keeps, and what the choice left out."""

    kept: tuple[int, ...]  # indices into the messages, ascending
    dropped_turns: int
    dropped_messages: int
    tokens: int  # count() of the kept messages; above the budget when even the fewest turns don't fit

    def messages(self, messages: Sequence[dict]) -> list[dict]:
        return [messages[i] for i in self.kept]


def turn_spans(messages: Sequence[dict]) -> tuple[int, list[tuple[int, int]]]:
    """(head length, [(start, end) of each turn]): the leading system messages, then a turn from each user
    message to the next (a chat that opens with an assistant greeting has that greeting as a turn)."""
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    starts = [i for i in range(head, len(messages)) if messages[i]["role"] == "user" or i == head]
    return head, [(a, b) for a, b in zip(starts, starts[1:] + [len(messages)])]


def drop_order(n_turns: int, policy: str, pinned: Sequence[bool] = ()) -> list[int]:
    """The turns `policy` leaves out, in the order it leaves them out (never the latest, n_turns - 1)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown context overflow policy {policy!r}; expected one of {', '.join(POLICIES)}")
    if policy == STOP_AT_LIMIT or n_turns < 2:
        return []
    if policy == ROLLING_WINDOW:
        return list(range(n_turns - 1))
    is_pinned = [bool(pinned[i]) if i < len(pinned) else False for i in range(n_turns)]
    middle = [i for i in range(1, n_turns - 1) if not is_pinned[i]]
    kept_late = [i for i in range(1, n_turns - 1) if is_pinned[i]]
    return middle + kept_late + [0]


def fit_turns(messages: Sequence[dict], count: Callable[[list[dict]], int], budget: int, policy: str,
              pinned: Callable[[dict], bool] = lambda m: False) -> Window:
    """The fewest whole turns `policy` must leave out of `messages` for count() to be at most `budget`;
    when even leaving out every turn it may does not get there, the smallest prompt it can make (its
    tokens then exceed the budget: the caller says the context is full). A turn is pinned when any of its
    messages is (`pinned`)."""
    head, spans = turn_spans(messages)
    order = drop_order(len(spans), policy, [any(pinned(messages[i]) for i in range(a, b)) for a, b in spans])
    counted: dict[int, Window] = {}

    def window(k: int) -> Window:
        if k not in counted:
            gone = set(order[:k])
            kept = tuple(range(head)) + tuple(i for t, (a, b) in enumerate(spans) if t not in gone for i in range(a, b))
            counted[k] = Window(kept, k, len(messages) - len(kept), count([messages[i] for i in kept]))
        return counted[k]

    if window(0).tokens <= budget or not order:
        return window(0)
    if window(len(order)).tokens > budget:
        return window(len(order))
    lo, hi = 0, len(order)  # window(lo) is over the budget, window(hi) within it
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if window(mid).tokens <= budget:
            hi = mid
        else:
            lo = mid
    return window(hi)

"""Reply ranks on a desktop: which replies keep their cache pages when the cache runs short.

The local engine ranks jobs by an integer priority (vLLM's convention: lower runs first, is admitted first and
gives its pages back last). The app sorts its replies into five kinds and the user orders the kinds
(Preferences, "replies/order"); by default the chat being looked at comes first:

  focused  the chat pane that has the focus (the current tab, or the tile clicked last)
  chats    every other chat's reply
  extras   versions 2..N of an "N replies" answer, and in compare mode the compared panes other than the
           focused one
  batch    rows of a batch run
  api      requests to the app's own OpenAI-compatible server (Server panel)

A kind's priority is its distance from the api kind in that order, times BAND: API requests keep the
priority their client sent (0 unless it sent one), so a request's own priority moves it inside the api band
(|priority| < BAND / 2 keeps it there) and the app's kinds sit around it without any change to the server.
"""
from __future__ import annotations

from typing import Any, Iterable

KINDS = ("focused", "chats", "extras", "batch", "api")
LABELS = {
    "focused": "The chat you are looking at",
    "chats": "Other chats",
    "extras": "Extra replies (N replies, compared panes)",
    "batch": "Batch-run rows",
    "api": "API requests (Server panel)",
}
BAND = 1000


def check_order(order: Iterable[str]) -> tuple[str, ...]:
    """The order as a tuple; ValueError unless it names every kind exactly once."""
    order = tuple(order)
    if sorted(order) != sorted(KINDS):
        raise ValueError(f"the reply order must name each of {', '.join(KINDS)} once, got {', '.join(order) or 'nothing'}")
    return order


class Priorities:
    """The priority of each reply by its job identifier: a chat's id (its reply), (chat id, i) (version i+1 of
    an N-replies answer), ("batch", run, row) (a batch row). `focus` says which chat is looked at and which
    chats are compared beside it."""

    def __init__(self, order: Iterable[str] = KINDS):
        self.order = check_order(order)
        self.focused: Any = None
        self.compared: frozenset = frozenset()

    def kind(self, identifier: Any) -> str:
        if isinstance(identifier, tuple):
            return "batch" if identifier and identifier[0] == "batch" else "extras"
        if identifier == self.focused:
            return "focused"
        return "extras" if identifier in self.compared else "chats"

    def of_kind(self, kind: str) -> int:
        return (self.order.index(kind) - self.order.index("api")) * BAND

    def priority(self, identifier: Any) -> int:
        return self.of_kind(self.kind(identifier))

    def focus(self, chat_id: Any, compared: Iterable = ()) -> None:
        self.focused, self.compared = chat_id, frozenset(compared) - {chat_id}

    def set_order(self, order: Iterable[str]) -> None:
        self.order = check_order(order)

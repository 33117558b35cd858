"""One colour (and name) per chat, shared by the chat panes and the page map.

The page map colours a job's pages by the job's identifier (a chat id, or an API request id), and each
chat pane shows the same colour as a swatch, so a user can tell which pages are whose. Colours are handed
out from the palette as chats become active and returned when they go, so they never repeat while fewer
chats than palette entries are active (unlike a colour per serial number, which repeats by chance).
Qt-free; the window's views read one module-level book because they do not know each other.
"""
from __future__ import annotations

from collections import Counter
from typing import Hashable

# Distinct, saturated hues; none is grey so they never read as "cached" or "free" on the page map.
PALETTE = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (227, 119, 194), (188, 189, 34), (23, 190, 207), (255, 187, 120), (152, 223, 138),
    (255, 152, 150), (197, 176, 213), (174, 199, 232), (219, 219, 141), (158, 218, 229),
    (240, 200, 40),
)


def _key(identifier: Hashable) -> Hashable:
    """Chat ids arrive as ints from panes and as ints or strings from metrics snapshots: one key for both."""
    text = str(identifier)
    return int(text) if text.isdigit() else text


class ColourBook:
    """Palette slots held by identifiers (reference-counted: a pane and the page map may both hold one)."""

    def __init__(self, palette: tuple[tuple[int, int, int], ...] = PALETTE):
        self.palette = palette
        self._slot: dict[Hashable, int] = {}
        self._holds: Counter = Counter()
        self._labels: dict[Hashable, str] = {}

    def acquire(self, identifier: Hashable) -> tuple[int, int, int]:
        key = _key(identifier)
        if key not in self._slot:
            used = set(self._slot.values())
            free = [i for i in range(len(self.palette)) if i not in used]
            self._slot[key] = free[0] if free else hash(key) % len(self.palette)  # more chats than colours
        self._holds[key] += 1
        return self.palette[self._slot[key]]

    def release(self, identifier: Hashable) -> None:
        key = _key(identifier)
        if self._holds[key] <= 1:
            self._holds.pop(key, None)
            self._slot.pop(key, None)
            self._labels.pop(key, None)
        else:
            self._holds[key] -= 1

    def slot(self, identifier: Hashable) -> int | None:
        return self._slot.get(_key(identifier))

    def colour(self, identifier: Hashable) -> tuple[int, int, int] | None:
        slot = self.slot(identifier)
        return self.palette[slot] if slot is not None else None

    def set_label(self, identifier: Hashable, label: str) -> None:
        """The name the page map shows for this identifier (a chat's title)."""
        self._labels[_key(identifier)] = label

    def label(self, identifier: Hashable) -> str | None:
        return self._labels.get(_key(identifier))


CHAT_COLOURS = ColourBook()

"""Banned strings: hold generated tokens that may begin a banned string; on a match, rewind and block.

Held tokens are neither streamed nor counted as written to the page table, so a rewind never touches a
page that was hashed or shared.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Rewind:
    position: int  # sequence length to truncate to
    suppressed_tokens: list[int]
    suppressed_text: str


class BannedStrings:
    def __init__(self, tokenizer: Any, strings: list[str], decode_special_tokens: bool = False):
        if isinstance(strings, str) or not all(isinstance(s, str) and s for s in strings):
            raise ValueError("banned_strings must be a list of non-empty strings")
        self.tokenizer = tokenizer
        self.strings = [s.lower() for s in strings]
        self.special = decode_special_tokens
        self.held: list[int] = []
        self.held_start = 0  # sequence position of held[0]
        self.blocked: dict[int, set[int]] = {}  # position -> tokens banned there after a rewind

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, decode_special_tokens=self.special)

    def feed(self, token: int, position: int) -> tuple[list[int], Rewind | None]:
        """Add the token at `position`; returns (tokens safe to stream now, rewind if a banned string formed)."""
        if not self.held:
            self.held_start = position
        self.held.append(token)
        text = self._text(self.held).lower()
        hits = [i for i in (text.find(s) for s in self.strings) if i >= 0]
        if hits:
            start = min(hits)
            j = next(j for j in range(len(self.held)) if len(self._text(self.held[: j + 1])) > start)
            pos = self.held_start + j
            self.blocked.setdefault(pos, set()).add(self.held[j])
            suppressed = self.held[j:]
            rewind = Rewind(pos, suppressed, self._text(suppressed))
            del self.held[j:]
            return [], rewind
        if any(text.endswith(s[:i]) for s in self.strings for i in range(1, len(s))):
            return [], None
        released, self.held = self.held, []
        return released, None

    def flush(self) -> list[int]:
        released, self.held = self.held, []
        return released

    def blocked_at(self, position: int) -> set[int]:
        return self.blocked.get(position, set())

"""LoopGuard: notices a reply stuck repeating itself, so its job can end with eos_reason "repetition".

Small models fall into loops: the same sentence or list item again and again until max_new_tokens. The
guard watches what a job streams and calls it a loop when either holds:

- **repeated unit**: one sentence or line, normalised, is seen for the `repeats`-th time (4 by default).
  Units end at a newline or after ".", "!" or "?" followed by whitespace. Normalising lowercases, drops a
  leading list marker ("-", "*", "+", "•", "#"s, "12." or "12)") and keeps only the words (runs of
  letters and digits), so "3. The soul finds its rhythm." and "- the soul finds its rhythm!" are one
  unit. Units of fewer than `min_words` words (4) are not counted: short lines ("Yes.", "}", "return x")
  and short list items repeat in normal text. Nor are lines inside ``` code fences, where repeated lines
  are ordinary. A unit longer than `max_unit_chars` is not counted either (it bounds the work per chunk).
- **periodic tail**: the last tokens are one block of p tokens (1 <= p <= `max_period`, 64) repeated:
  the tail over which token[i] == token[i - p] holds, plus the first copy, covers at least `repeats`
  copies and at least `min_span` tokens (48), e.g. one 20-token sentence four times over (80 tokens) or
  one word 48 times. This catches loops without sentence ends (a word or phrase run, code lines repeated
  exactly inside a fence) and needs no text at all.

So a looping reply is stopped at the 4th copy of what it repeats. Per token the guard does O(max_period)
work in numpy (a run length per period), and per chunk of text work proportional to the chunk plus the
current unfinished unit: never the whole reply, so it stays cheap on long replies.
"""
from __future__ import annotations

import re

import numpy as np

_UNIT_END = re.compile(r"(?<=[.!?])\s+|\n")
_LIST_MARKER = re.compile(r"^\s*(?:[-*+•]|#+|\d+[.)])\s+")
_WORD = re.compile(r"\w+")


class LoopGuard:
    """Feed it a job's released tokens and streamed text; `feed` returns True once the reply loops, and
    `found` then says what repeated."""

    def __init__(self, repeats: int = 4, min_words: int = 4, min_span: int = 48, max_period: int = 64,
                 max_unit_chars: int = 600):
        if repeats < 2 or min_words < 1 or min_span < 1 or max_period < 1 or max_unit_chars < 1:
            raise ValueError("LoopGuard needs repeats >= 2 and positive min_words, min_span, max_period, "
                             "max_unit_chars")
        self.repeats = repeats
        self.min_words = min_words
        self.min_span = min_span
        self.max_period = max_period
        self.max_unit_chars = max_unit_chars
        self.found: str | None = None  # what repeated, once a loop is found
        self._recent = np.full(max_period, -1, dtype=np.int64)  # _recent[p - 1]: the token p back
        self._runs = np.zeros(max_period, dtype=np.int64)  # trailing positions with token[i] == token[i - p]
        self._periods = np.arange(1, max_period + 1)
        self._need = np.maximum(repeats * self._periods, min_span) - self._periods
        self._unit = ""  # the current, unfinished sentence or line
        self._in_code = False
        self._skip = False  # the current unit outgrew max_unit_chars: not counted
        self._counts: dict[str, int] = {}

    def feed(self, tokens: list[int], text: str = "") -> bool:
        """Add tokens and the text they released; True once a loop is found (and from then on)."""
        if self.found is None:
            for token in tokens:
                self._token(token)
                if self.found is not None:
                    break
        if self.found is None and text:
            self._text(text)
        return self.found is not None

    def _token(self, token: int) -> None:
        same = self._recent == token  # -1 (nothing fed that far back yet) never matches
        self._runs = np.where(same, self._runs + 1, 0)
        self._recent[1:] = self._recent[:-1]
        self._recent[0] = token
        hits = np.flatnonzero(self._runs >= self._need)
        if hits.size:
            p = int(self._periods[hits[0]])
            self.found = f"a {p}-token block repeated {(int(self._runs[hits[0]]) + p) // p} times"

    def _text(self, text: str) -> None:
        pieces = _UNIT_END.split(self._unit + text)
        self._unit = pieces.pop()
        for piece in pieces:
            if not self._skip:
                self._end_unit(piece)
            self._skip = False
            if self.found is not None:
                return
        if len(self._unit) > self.max_unit_chars:  # too long to count: skip to its end
            self._unit = self._unit[-1:] if self._unit[-1] in ".!?" else ""
            self._skip = True

    def _end_unit(self, unit: str) -> None:
        if unit.lstrip().startswith("```"):
            self._in_code = not self._in_code
            return
        if self._in_code:
            return
        words = _WORD.findall(_LIST_MARKER.sub("", unit, count=1).lower())
        if len(words) < self.min_words:
            return
        key = " ".join(words)
        self._counts[key] = count = self._counts.get(key, 0) + 1
        if count >= self.repeats:
            self.found = f"{unit.strip()[:80]!r} repeated {count} times"

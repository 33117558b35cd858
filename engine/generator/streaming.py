"""TextStream: a job's new token ids -> the text that may be shown now.

Two hold-backs sit between the sampler and the screen, as in ExLlamaV2's dynamic generator:
- bytes: a byte-level tokenizer splits one character over several tokens, so the tail of a
  decode can be an incomplete UTF-8 sequence (decoded as U+FFFD). Those tokens stay pending
  until the character completes; a cap lets genuinely invalid bytes through eventually.
- stop strings: text that may be the start of a stop string is held until it either completes
  the stop string (then it and everything after it is never streamed) or diverges (then it is
  released).

Decoding is incremental: each feed decodes only the pending tokens plus a few committed tokens
of context (so tokenizers that strip a leading space from a lone token still get spaces right),
which keeps the cost per token constant however long the completion grows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

REPLACEMENT = "\ufffd"
# Committed tokens decoded again as left context: enough for SentencePiece-style leading spaces.
CONTEXT_TOKENS = 4
# Pending tokens whose decode still ends in U+FFFD after this many are let through: a UTF-8
# character has at most 4 bytes, so a valid one completes long before (several per feed allowed).
MAX_HELD_TOKENS = 16


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], decode_special_tokens: bool = False) -> str: ...


@dataclass
class StreamChunk:
    """What one feed() produced.

    text: emit now. stop_string: the stop string that completed in this feed, or None.
    held: on a stop, the stop string and everything decoded after it (never streamed).
    """

    text: str
    stop_string: str | None = None
    held: str = ""


class TextStream:
    """Incremental detokenizer with UTF-8 and stop-string hold-back for one job."""

    def __init__(self, tokenizer: Decoder, stop_strings: Iterable[str] = (),
                 decode_special_tokens: bool = False):
        stops = list(stop_strings or ())
        for s in stops:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {type(s).__name__}: {s!r}")
            if s == "":
                raise ValueError("empty stop string: it would stop before the first token")
        self.tokenizer = tokenizer
        self.stop_strings: list[str] = list(dict.fromkeys(stops))
        self.decode_special_tokens = decode_special_tokens
        self._context: list[int] = []     # last committed tokens, decoded as left context
        self._context_text = ""           # decode(self._context), cached
        self._pending: list[int] = []     # tokens whose text is not complete yet
        self._pending_emitted = 0         # chars of the pending decode already passed on
        self._held_text = ""              # text that may be the start of a stop string
        self.stopped: str | None = None   # the stop string that ended the stream
        self.finished = False

    @property
    def held_text(self) -> str:
        """Text decoded but not yet streamed (stop-string prefix; not incomplete bytes)."""
        return self._held_text

    def feed(self, token_ids: Sequence[int]) -> StreamChunk:
        """Add a job's newly sampled tokens; return the text that may be streamed now."""
        if self.finished:
            raise RuntimeError("TextStream.feed() after the stream ended (stop string or flush())")
        ids = [int(t) for t in token_ids]
        if not ids:
            return StreamChunk("")
        self._pending.extend(ids)
        return self._push_text(self._decode_pending(final=False))

    def flush(self) -> str:
        """End the stream and return everything held (the caller reports it, never streams it)."""
        if self.finished:
            return ""
        rest = self._held_text + self._decode_pending(final=True)
        self._held_text = ""
        self.finished = True
        return rest

    # -- bytes -> complete text ------------------------------------------------------------------

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, decode_special_tokens=self.decode_special_tokens)

    def _decode_pending(self, final: bool) -> str:
        """New complete text of the pending tokens; commits them once their text is complete."""
        if not self._pending:
            return ""
        full = self._decode(self._context + self._pending)
        if full.startswith(self._context_text):
            text = full[len(self._context_text):]
        else:  # the decoder rewrote the context's text (space clean-up): decode alone instead
            text = self._decode(self._pending)
        complete = text.rstrip(REPLACEMENT)
        if len(complete) < len(text) and not final and len(self._pending) < MAX_HELD_TOKENS:
            # Incomplete character at the tail: pass on what precedes it, keep the tokens.
            out = complete[self._pending_emitted:]
            self._pending_emitted = max(self._pending_emitted, len(complete))
            return out
        out = text[self._pending_emitted:]
        window = self._context + self._pending
        self._context = window[-CONTEXT_TOKENS:]
        self._context_text = self._decode(self._context)
        self._pending = []
        self._pending_emitted = 0
        return out

    # -- complete text -> streamable text ----------------------------------------------------

    def _push_text(self, new_text: str) -> StreamChunk:
        buf = self._held_text + new_text
        if not self.stop_strings:
            self._held_text = ""
            return StreamChunk(buf)
        hit_at, hit = -1, None
        for s in self.stop_strings:
            i = buf.find(s)
            if i != -1 and (hit is None or i < hit_at):
                hit_at, hit = i, s
        if hit is not None:
            held = buf[hit_at:] + self._decode_pending(final=True)
            self._held_text = ""
            self.stopped = hit
            self.finished = True
            return StreamChunk(buf[:hit_at], stop_string=hit, held=held)
        keep = self._stop_prefix_len(buf)
        self._held_text = buf[len(buf) - keep:] if keep else ""
        return StreamChunk(buf[:len(buf) - keep])

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop_strings:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

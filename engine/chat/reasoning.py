"""Reasoning: a thinking model's `<think>…</think>` text told apart from its answer, also while it streams.

Which markers a model uses is read off its chat template (the template that strips old thinking from
the history names them): `<think>`/`</think>` for Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3 and
Phi-4-reasoning; `[THINK]`/`[/THINK]` for Mistral's Magistral. A template without markers has no
reasoning, and its replies pass through untouched. A harmony template (gpt-oss) gets HARMONY: its
thinking is the `analysis` channel, which engine.chat.harmony_parser reads instead of this splitter.

Reasoning is recognised only where the model starts it: at the very start of the reply (after
whitespace), or already open when the generation prompt itself ends inside a think block (DeepSeek-R1
distills and Qwen3-Thinking-2507 put `<think>\\n` there, so the reply starts as reasoning and only the
closing marker is generated). A marker later in the reply is ordinary text: a model explaining the tags
does not lose half its answer. Whitespace right after a marker and before the closing one is dropped,
as vLLM's clients and the templates themselves strip it.

ReasoningParser is the streaming form; split_reasoning() runs the same parser over a whole text, so a
streamed reply and the same reply split at once give the same two parts.
"""
from __future__ import annotations

from dataclasses import dataclass

from .harmony import END, uses_harmony


@dataclass(frozen=True)
class ReasoningMarkers:
    """The opening and closing marker of a family's thinking block."""

    start: str
    end: str


THINK = ReasoningMarkers("<think>", "</think>")
MISTRAL_THINK = ReasoningMarkers("[THINK]", "[/THINK]")
KNOWN_MARKERS = (THINK, MISTRAL_THINK)
# harmony's analysis channel (gpt-oss): the reply is read by channels (engine.chat.harmony_parser)
HARMONY = ReasoningMarkers("<|channel|>analysis<|message|>", END)


def reasoning_markers(template: str | None) -> ReasoningMarkers | None:
    """The markers a chat template's source uses for thinking, or None (not a reasoning template)."""
    if not template:
        return None
    if uses_harmony(template):
        return HARMONY
    for markers in KNOWN_MARKERS:
        if markers.end in template:
            return markers
    return None


def starts_in_reasoning(prompt: str, markers: ReasoningMarkers | None) -> bool:
    """Whether a rendered prompt ends inside an open think block (the reply then starts as reasoning)."""
    if markers is None:
        return False
    opened = prompt.rfind(markers.start)
    return opened >= 0 and prompt.find(markers.end, opened) < 0


def supports_thinking_switch(template: str | None) -> bool:
    """Whether the template takes Qwen3's `enable_thinking` variable (a per-chat thinking on/off switch)."""
    return bool(template) and "enable_thinking" in template


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (could still become it)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """Streaming splitter: feed() the reply's text as it comes, get (reasoning delta, content delta).

    States: "start" (nothing but whitespace seen yet: an opening marker may still come), "reasoning"
    (inside the think block), "content" (the answer). Text that might be the beginning of a marker is
    held back until the next feed() shows what it is, and flushed by finish().
    """

    def __init__(self, markers: ReasoningMarkers | None = THINK, *, in_reasoning: bool = False):
        self.markers = markers
        self.state = "content" if markers is None else "reasoning" if in_reasoning else "start"
        self._buf = ""  # text not yet handed out (a possible marker prefix or whitespace)
        self._lead = markers is not None  # in this part nothing but whitespace has been handed out yet
        self.reasoning = ""  # everything handed out so far, per part
        self.content = ""

    @property
    def in_reasoning(self) -> bool:
        return self.state == "reasoning"

    def feed(self, text: str) -> tuple[str, str]:
        """Take the next piece of the reply; returns what it adds to (reasoning, content)."""
        self._buf += text
        reasoning, content = [], []
        while True:
            if self.state == "content":
                out = self._buf if not self._lead else self._buf.lstrip()
                self._buf = ""
                if out:
                    self._lead = False
                    content.append(out)
                break
            if self.state == "start":
                stripped = self._buf.lstrip()
                start = self.markers.start
                if stripped.startswith(start):
                    self._buf = stripped[len(start):]
                    self.state, self._lead = "reasoning", True
                    continue
                if not stripped or start.startswith(stripped):
                    break  # whitespace or a partial opening marker: wait for more
                self.state, self._lead = "content", False  # no think block: the reply as it came
                continue
            # reasoning: hand out text up to a possible closing marker, keep trailing whitespace back
            end = self.markers.end
            at = self._buf.find(end)
            if at >= 0:
                piece = self._buf[:at].rstrip()
                if self._lead:
                    piece = piece.lstrip()
                if piece:
                    reasoning.append(piece)
                self._buf = self._buf[at + len(end):]
                self.state, self._lead = "content", True
                continue
            keep = _held_prefix(self._buf, end)
            piece = self._buf[:len(self._buf) - keep]
            if self._lead:
                piece = piece.lstrip()
            body = piece.rstrip()
            self._buf = piece[len(body):] + self._buf[len(self._buf) - keep:]
            if body:
                self._lead = False
                reasoning.append(body)
            break
        r, c = "".join(reasoning), "".join(content)
        self.reasoning += r
        self.content += c
        return r, c

    def finish(self) -> tuple[str, str]:
        """The reply ended: hand out what was held back; returns the last (reasoning, content) deltas."""
        buf, self._buf = self._buf, ""
        r = c = ""
        if self.state == "reasoning":  # an unclosed think block: its trailing whitespace goes
            r = buf.strip() if self._lead else buf.rstrip()
        elif self.state == "start":  # whitespace or part of an opening marker only: plain text after all
            c = buf
        self.reasoning += r
        self.content += c
        return r, c


def split_reasoning(text: str, markers: ReasoningMarkers | None = THINK, *,
                    in_reasoning: bool = False) -> tuple[str, str]:
    """(reasoning, content) of a whole reply, exactly as streaming it through ReasoningParser gives (a
    harmony reply, markers HARMONY: its analysis and its answer channels, calls left out)."""
    if markers is HARMONY:
        from .harmony_parser import HarmonyParser

        harmony = HarmonyParser()
        parts = [harmony.feed(text), harmony.finish()]
        return "".join(p.reasoning for p in parts), "".join(p.content for p in parts)
    parser = ReasoningParser(markers, in_reasoning=in_reasoning)
    parser.feed(text)
    parser.finish()
    return parser.reasoning, parser.content

"""A chat's prompt encoded once; the prompts that leave out some of its messages are cut from the same ids.

Fitting a chat into the context counts its prompt, then counts it again for every turn it leaves out, and
the job needs the ids of the prompt it kept: encoding each of them would tokenize the same text 2 + k
times per send. A tokenizer splits its input at special tokens before anything else and encodes each
piece between them on its own, so when the shorter prompt's text is the full prompt's text with one span
removed, and that span starts where a special token starts and ends where the same special token starts
again (as chat templates mark every message), its ids are the full prompt's ids with that span's tokens
removed: the same ids encoding it would give. Where that does not hold (a template that renders the
shorter chat differently, no special token at the cut), the shorter prompt is encoded itself.
"""
from __future__ import annotations

import re
from typing import Any
from weakref import WeakKeyDictionary

from app.core.images import engine_messages
from app.core.store import ChatSettings
from engine.chat import render_kwargs, supports_thinking_switch, template_messages, tool_call_format


def _effort(tokenizer: Any, settings: ChatSettings) -> str | None:
    """The chat's reasoning effort where the model's chats are harmony (gpt-oss's system message says it)."""
    return settings.reasoning_effort if getattr(tokenizer.chat_format, "harmony", False) else None


def prompt_text(tokenizer: Any, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> str:
    """Chat template over system prompt + history (and the chat's tools, which the template renders). A
    trailing assistant message is continued: its text follows the generation prompt, unclosed. The chat's
    thinking switch goes to templates that take one (Qwen3's enable_thinking), its reasoning effort to a
    harmony model (gpt-oss)."""
    partial = history[-1]["content"] if history and history[-1]["role"] == "assistant" else None
    if partial is not None:
        history = history[:-1]
    messages = ([{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []) + history
    template = tokenizer.chat_template
    # tool calls and results as the template takes them (or, for a template that knows no tools, as text)
    messages = template_messages(messages, template, tool_call_format(template), tools)
    extra = render_kwargs(tools, template, enable_thinking=settings.thinking if supports_thinking_switch(template) else None,
                          reasoning_effort=_effort(tokenizer, settings))
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, **extra) + (partial or "")


def has_images(history: list[dict]) -> bool:
    """Whether a history entry carries attached images (app.core.images.with_images)."""
    return any(entry.get("images") for entry in history)


def image_prompt(tokenizer: Any, vision: Any, history: list[dict], settings: ChatSettings,
                 tools: list[dict] | None = None) -> tuple[Any, list]:
    """((1, n) ids, the images' embeddings) of a history whose user entries carry images, for a job with
    embeddings: the same messages prompt_text renders (system prompt, tools, thinking switch), the images
    as engine parts (engine_messages), encoded by the model's vision encoder in engine.image_prompt."""
    import engine

    partial = history[-1]["content"] if history and history[-1]["role"] == "assistant" else None
    if partial is not None:
        history = history[:-1]
    messages = ([{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []) \
        + engine_messages(history)
    template = tokenizer.chat_template
    messages = template_messages(messages, template, tool_call_format(template), tools)
    thinking = settings.thinking if supports_thinking_switch(template) else None
    extra = render_kwargs(tools, template, enable_thinking=thinking, reasoning_effort=_effort(tokenizer, settings))
    ids, embeddings = engine.image_prompt(messages, tokenizer, vision, **extra)
    if partial:
        ids = ids.new_tensor([ids[0].tolist() + encode(tokenizer, partial)[0].tolist()])
    return ids, embeddings


def encode(tokenizer: Any, text: str):
    """(1, n) ids of a prompt's text; special-token text is encoded as the special token."""
    return tokenizer.encode(text, add_bos=False, encode_special_tokens=True)


class ChatPrompt:
    """One history's prompt, encoded once, and the ids of the same history less a run of its messages."""

    def __init__(self, tokenizer: Any, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None):
        self.tokenizer = tokenizer
        self.template = tokenizer.chat_format
        self.history = [dict(m) for m in history]
        self.system_prompt = settings.system_prompt
        self.thinking = settings.thinking
        self.effort = settings.reasoning_effort
        self.tools = tools or None
        self.text = prompt_text(tokenizer, history, settings, tools)
        self.ids = encode(tokenizer, self.text)
        self._marks: list[tuple[int, int, int]] | None = None  # (char position, special token id, token index)

    def ids_of(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None):
        """The ids of `history`'s prompt when it is this history less one run of messages (its oldest, or
        some in the middle; else None): cut from this prompt's ids where that is exact (see the module
        docstring), otherwise encoded."""
        removed = len(self.history) - len(history)
        if (removed < 0 or settings.system_prompt != self.system_prompt or self.tokenizer.chat_format != self.template
                or (tools or None) != self.tools or settings.thinking != self.thinking
                or settings.reasoning_effort != self.effort):
            return None
        same = _common_prefix(self.history, history)
        if self.history[same + removed:] != history[same:]:
            return None
        if removed == 0:
            return self.ids
        text = prompt_text(self.tokenizer, history, settings, tools)
        cut = self._cut(text)
        return cut if cut is not None else encode(self.tokenizer, text)

    def _cut(self, text: str):
        """This prompt's ids less the tokens of the one span of its text that `text` lacks, or None."""
        full, removed = self.text, len(self.text) - len(text)
        if removed <= 0:
            return None
        prefix = _common_prefix(full, text)
        suffix = _common_prefix(full[::-1], text[::-1])
        # the span [a, a + removed) can sit anywhere that keeps both ends matching: a in [len(text) - suffix, prefix]
        lowest = max(0, len(text) - suffix)
        marks = {pos: (token, index) for pos, token, index in self._special_marks()}
        for a in range(lowest, prefix + 1):
            start, end = marks.get(a), marks.get(a + removed)
            if start is not None and end is not None and start[0] == end[0]:
                keep = self.ids.new_ones(self.ids.shape).bool()
                keep[:, start[1]:end[1]] = False
                return self.ids[keep].unsqueeze(0)
        return None

    def _special_marks(self) -> list[tuple[int, int, int]]:
        """Where each special token sits in the text and in the ids; [] unless the text's special tokens
        (found leftmost-longest, as the tokenizer splits them) are exactly the ids' special tokens."""
        if self._marks is None:
            pattern, ids_of_text = _special_pattern(self.tokenizer)
            ids = self.ids[0].tolist()
            special = self.tokenizer.special_token_ids
            in_ids = [(i, t) for i, t in enumerate(ids) if t in special]
            in_text = [(m.start(), ids_of_text[m.group()]) for m in pattern.finditer(self.text)] if pattern else []
            same = len(in_ids) == len(in_text) and all(a[1] == b[1] for a, b in zip(in_ids, in_text))
            self._marks = [(pos, token, i) for (pos, token), (i, _) in zip(in_text, in_ids)] if same else []
        return self._marks


_PATTERNS: WeakKeyDictionary = WeakKeyDictionary()  # tokenizer -> _special_pattern's answer


def _special_pattern(tokenizer: Any) -> tuple[re.Pattern | None, dict[str, int]]:
    """A regex matching the tokenizer's special tokens (longest first), and each one's id by its text."""
    if tokenizer not in _PATTERNS:
        texts = {tokenizer.decode([i], decode_special_tokens=True): i for i in sorted(tokenizer.special_token_ids)}
        texts.pop("", None)
        pattern = re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True))) if texts else None
        _PATTERNS[tokenizer] = pattern, texts
    return _PATTERNS[tokenizer]


def _common_prefix(a: str | list, b: str | list) -> int:
    """Length of the longest common prefix (a binary search over slice comparisons, which run in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo

"""A message's content as its chat template reads it: a plain string, or a list of typed parts.

OpenAI messages carry text as a string or as parts ({"type": "text", "text": ...}, image parts beside).
Most chat templates print a string content and some (Gemma 3) take either, but a VLM's template such as
SmolVLM's (Idefics3) only iterates parts: handed a string it renders the words as nothing (each character
is a "part" of no type) and an empty string makes it fail on `content[0]`. Which kind a template takes is
found by rendering one probe message both ways, so every prompt of a parts-only template, with images or
without, gets its contents as parts. Torch-free: the tokenizer, the server and the app share it.
"""
from __future__ import annotations

from typing import Callable

PROBE = "pagedeck-content-probe"


def takes_content_parts(render: Callable[[list[dict]], str]) -> bool:
    """Whether a template (`render`: messages -> prompt text) shows a message's text only when it comes
    as parts: a string content's text is missing from the prompt (or the render fails) while the same
    text as one text part is there."""
    def shows(content: object) -> bool:
        try:
            return PROBE in render([{"role": "user", "content": content}])
        except Exception:  # noqa: BLE001 - a template's raise_exception or a jinja2 error: not shown
            return False

    return not shows(PROBE) and shows([{"type": "text", "text": PROBE}])


def as_parts(messages: list[dict]) -> list[dict]:
    """The messages with each string (or missing) content turned into one text part; parts stay as they
    are. The input is not modified."""
    out = []
    for m in messages:
        content = m.get("content")
        if content is None or isinstance(content, str):
            m = {**m, "content": [{"type": "text", "text": content or ""}]}
        out.append(m)
    return out

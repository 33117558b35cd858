"""Export one chat as Markdown (to read) or JSON (to re-import or process), including reply stats.

A chat exports the path it shows (a branch exports its own history, the shared part included); its
header says when it was exported, when the chat last changed, and which chat it was branched from. A
reply's tool calls (with their results) and its thinking (with its token count and time) are exported
with it: in Markdown as blocks before the answer (the thinking folded in a <details>), in JSON as
`tool_calls` and `thinking` beside the reply's raw text. A message's images go with it: in Markdown as
files in a folder beside the export (`chat_images/` for `chat.md`) shown with image links, in JSON as
data: URLs with their type and size.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from app.core.formatting import stats_text
from app.core.images import AttachedImage, MessageImages
from app.core.reply_trace import ReplyTrace, Thinking, ToolCallRecord
from app.core.store import Chat, Message, Store
from engine.chat import HARMONY, THINK, split_reasoning
from engine.chat.harmony import uses_harmony

FORMAT_VERSION = 1


def _iso(t: float) -> str:
    """Local time with its UTC offset: what the reader's clock said, and still unambiguous."""
    return datetime.fromtimestamp(t, timezone.utc).astimezone().isoformat(timespec="seconds")


def _calls_markdown(calls: list[ToolCallRecord]) -> list[str]:
    lines: list[str] = []
    for i, c in enumerate(calls):
        if c.preface and (i == 0 or calls[i - 1].round != c.round):
            lines += [c.preface, ""]
        lines += [f"**Tool call** `{c.server}/{c.name}` ({c.state}): `{c.arguments}`", "", "```text", c.result, "```", ""]
    return lines


def to_markdown(chat: Chat, messages: list[Message], exported_at: float | None = None,
                branched_from: str | None = None, trace: ReplyTrace | None = None, images: MessageImages | None = None,
                image_link=None) -> str:
    """`image_link(message, ordinal, image)`: where an image was written, relative to the export."""
    when = _iso(time.time() if exported_at is None else exported_at)
    lines = [f"# {chat.title}", "", f"*Exported {when} · chat updated {_iso(chat.updated)}*", ""]
    if branched_from is not None:
        lines[-1:-1] = [f"*Branched from \"{branched_from}\"*"]
    if chat.settings.system_prompt:
        lines += ["## System", "", chat.settings.system_prompt, ""]
    for m in messages:
        content = m.content
        lines += [f"## {'User' if m.role == 'user' else 'Assistant'}", ""]
        if m.role == "assistant" and trace is not None:
            reasoning, content = _split(m.content)
            thought = trace.thinking(m.id)
            if reasoning:
                summary = f"Thought for {thought.seconds:.1f} s · {thought.tokens} tokens" if thought else "Thoughts"
                lines += ["<details><summary>" + summary + "</summary>", "", reasoning, "", "</details>", ""]
            lines += _calls_markdown(trace.calls(m.id))
        for i, image in enumerate(images.of(m.id) if images is not None and image_link is not None else ()):
            lines += [f"![image {i + 1}: {image.label()}]({image_link(m, i, image)})", ""]
        lines += [content, ""]
        if m.stats is not None:
            lines += [f"<sub>{stats_text(m.stats)}</sub>", ""]
    return "\n".join(lines).rstrip() + "\n"


def _split(content: str) -> tuple[str, str]:
    """(thinking, answer) of a stored reply: a harmony reply (gpt-oss, stored with its channels) by its
    channels, any other by its think markers."""
    return split_reasoning(content, HARMONY if uses_harmony(content) else THINK)


def _images_json(m: Message, images: MessageImages | None) -> dict:
    found = images.of(m.id) if images is not None else []
    return {"images": [{"mime": im.mime, "width": im.width, "height": im.height, "data_url": im.data_url()}
                       for im in found]} if found else {}


def _extras(m: Message, trace: ReplyTrace | None) -> dict:
    """A reply's tool calls and thinking for the JSON export (nothing for a reply that had neither)."""
    if trace is None or m.role != "assistant":
        return {}
    out: dict = {}
    calls = trace.calls(m.id)
    if calls:
        out["tool_calls"] = [{"round": c.round, "id": c.call_id, "server": c.server, "name": c.name,
                              "arguments": c.arguments, "state": c.state, "result": c.result,
                              "text": c.preface, "reasoning": c.reasoning} for c in calls]
    reasoning, _answer = _split(m.content)
    thought: Thinking | None = trace.thinking(m.id)
    if reasoning or thought is not None:
        out["thinking"] = {"text": reasoning, **({"tokens": thought.tokens, "seconds": thought.seconds} if thought else {})}
    return out


def to_json(chat: Chat, messages: list[Message], exported_at: float | None = None,
            branched_from: str | None = None, trace: ReplyTrace | None = None, images: MessageImages | None = None,
            image_link=None) -> str:
    doc = {
        "format": "pagedeck-chat",
        "version": FORMAT_VERSION,
        "title": chat.title,
        "created": _iso(chat.created),
        "updated": _iso(chat.updated),
        "exported": _iso(time.time() if exported_at is None else exported_at),
        **({"branched_from": branched_from} if branched_from is not None else {}),
        "settings": asdict(chat.settings),
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "created": _iso(m.created),
                **({"stats": {**asdict(m.stats), "adapters": m.stats.adapter_pairs()}} if m.stats is not None else {}),
                **_extras(m, trace),
                **_images_json(m, images),
            }
            for m in messages
        ],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def export_chat(store: Store, chat_id: int, path: str | Path) -> Path:
    """Write the chat to `path`; the suffix (.md / .markdown / .json) picks the format."""
    path = Path(path)
    suffix = path.suffix.lower()
    writers = {".md": to_markdown, ".markdown": to_markdown, ".json": to_json}
    if suffix not in writers:
        raise ValueError(f"cannot export to {path.name!r}: use a .md or .json file name")
    chat = store.chat(chat_id)
    source = None
    if chat.branch_of is not None:
        try:
            source = store.chat(store.message(chat.branch_of).chat_id).title
        except KeyError:  # the chat it came from was deleted
            source = "a deleted chat"
    folder = path.with_name(path.stem + "_images")

    def image_link(m: Message, i: int, image: AttachedImage) -> str:
        folder.mkdir(exist_ok=True)
        name = f"message{m.id}_{i + 1}.{image.mime.partition('/')[2].replace('jpeg', 'jpg')}"
        (folder / name).write_bytes(image.data)
        return f"{folder.name}/{name}"

    text = writers[suffix](chat, store.messages(chat_id), exported_at=time.time(), branched_from=source,
                           trace=ReplyTrace(store), images=MessageImages(store), image_link=image_link)
    path.write_text(text, encoding="utf-8")
    return path

"""Export one chat as Markdown (to read) or JSON (to re-import or process), including reply stats."""
from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from app.formatting import stats_text
from app.store import Chat, Message, Store

FORMAT_VERSION = 1


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def to_markdown(chat: Chat, messages: list[Message]) -> str:
    lines = [f"# {chat.title}", "", f"*Exported {_iso(chat.updated)}*", ""]
    if chat.settings.system_prompt:
        lines += ["## System", "", chat.settings.system_prompt, ""]
    for m in messages:
        lines += [f"## {'User' if m.role == 'user' else 'Assistant'}", "", m.content, ""]
        if m.stats is not None:
            lines += [f"<sub>{stats_text(m.stats)}</sub>", ""]
    return "\n".join(lines).rstrip() + "\n"


def to_json(chat: Chat, messages: list[Message]) -> str:
    doc = {
        "format": "pagedeck-chat",
        "version": FORMAT_VERSION,
        "title": chat.title,
        "created": _iso(chat.created),
        "updated": _iso(chat.updated),
        "settings": asdict(chat.settings),
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "created": _iso(m.created),
                **({"stats": asdict(m.stats)} if m.stats is not None else {}),
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
    text = writers[suffix](store.chat(chat_id), store.messages(chat_id))
    path.write_text(text, encoding="utf-8")
    return path

"""Images attached to chat messages: checked on attach, kept in the history, sent the way each backend takes them.

An attachment is checked once, when the user attaches it, with the server's own gate
(engine.vision.image_input: byte, pixel and format limits; an animated GIF counts as its first frame)
and kept as the file's original bytes (no re-encoding, so what is stored is what was attached). The
table `message_images` lives beside the store's (created here if missing, outside the store's schema
version; rows go with their message), and a message with images is written in one transaction with its
images, so a crash never leaves a message whose images are missing.

In a prompt, a user message's images ride as `images` on its history entry (`with_images`): a remote
server gets them as OpenAI `image_url` parts with data: URLs (`openai_messages`), an engine that sees
images as `{"type": "image", "image": PIL.Image}` parts (`engine_messages`); a model known to read text
only gets a short note in the text instead ("[image: 640x480 PNG, not shown to this model]"), never a
silent drop. Qt-free: the chat pane turns the bytes into thumbnails.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from app.core.store import Message, ReplyStats, Store
from engine.vision.image_input import (
    DEFAULT_MAX_BYTES, FORMATS, ImageError, data_url, decode_image, image_format,
)

__all__ = ["AttachedImage", "ImageError", "MessageImages", "attach_bytes", "attach_file", "cannot_see_message",
           "engine_messages", "openai_messages", "sees_images", "image_tokens", "with_images"]

_TABLE = """
CREATE TABLE IF NOT EXISTS message_images (
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    mime TEXT NOT NULL,
    bytes BLOB NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    PRIMARY KEY (message_id, ordinal)
)"""


@dataclass(frozen=True)
class AttachedImage:
    mime: str  # image/png, image/jpeg, image/webp or image/gif
    data: bytes  # the file as attached
    width: int
    height: int

    @property
    def kind(self) -> str:
        return self.mime.partition("/")[2].upper()

    def label(self) -> str:
        return f"{self.width}x{self.height} {self.kind}"

    def data_url(self) -> str:
        return data_url(self.data, self.mime)

    def pil(self):
        """The RGB image an engine reads (first frame of an animation)."""
        return decode_image(self.data)


def attach_bytes(data: bytes) -> AttachedImage:
    """Check an image (ImageError naming the problem) and keep its bytes."""
    fmt, width, height = image_format(data)
    decode_image(data)  # the pixel data too: a truncated file is refused now, not when it is sent
    return AttachedImage(FORMATS[fmt], bytes(data), width, height)


def attach_file(path: str | Path) -> AttachedImage:
    """An image file from disk; its size is checked before it is read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > DEFAULT_MAX_BYTES:
            raise ImageError(f"{path.name} is {size / 2**20:.1f} MiB, over the {DEFAULT_MAX_BYTES / 2**20:.1f} "
                             "MiB limit for an image")
        data = path.read_bytes()
    except OSError as exc:
        raise ImageError(f"cannot read {path.name}: {exc.strerror or exc}") from None
    try:
        return attach_bytes(data)
    except ImageError as exc:
        raise ImageError(f"{path.name}: {exc}") from None


class MessageImages:
    """The images of every message in one store (one table, the store's connection and transactions)."""

    def __init__(self, store: Store):
        self.store = store
        self._db = store._db
        self._db.execute(_TABLE)

    def add_message(self, chat_id: int, role: str, content: str, images: Iterable[AttachedImage] = (),
                    stats: ReplyStats | None = None, parent_id: Any = ...) -> Message:
        """Store.add_message and the message's images in one transaction."""
        images = list(images)
        with self.store._tx():
            message = self.store.add_message(chat_id, role, content, stats, parent_id)
            self._insert(message.id, images)
        return message

    def _insert(self, message_id: int, images: list[AttachedImage]) -> None:
        self._db.executemany(
            "INSERT INTO message_images (message_id, ordinal, mime, bytes, width, height) VALUES (?, ?, ?, ?, ?, ?)",
            [(message_id, i, im.mime, im.data, im.width, im.height) for i, im in enumerate(images)])

    def of(self, message_id: int) -> list[AttachedImage]:
        rows = self._db.execute("SELECT mime, bytes, width, height FROM message_images WHERE message_id=? "
                                "ORDER BY ordinal", (message_id,))
        return [AttachedImage(r[0], bytes(r[1]), r[2], r[3]) for r in rows]

    def copy(self, from_id: int, to_id: int) -> None:
        """A branch's or an edit's copy of a message keeps its images."""
        images = self.of(from_id)
        if images:
            with self.store._tx():
                self._insert(to_id, images)


# ---- what a backend knows about images ---------------------------------------------------------------
def sees_images(backend: Any, settings: Any = None) -> bool | None:
    """True/False where the backend knows whether its model sees images; None where it can't know (a
    remote server: it answers for itself)."""
    fn = getattr(backend, "sees_images", None)
    return fn(settings) if fn is not None else None


def image_tokens(backend: Any, images: Iterable[AttachedImage], settings: Any = None) -> int | None:
    """The prompt tokens these images cost on the backend's model; None when unknown."""
    fn = getattr(backend, "image_tokens", None)
    total = 0
    for im in images:
        n = fn(im, settings) if fn is not None else None
        if n is None:
            return None
        total += n
    return total


def cannot_see_message(model: str | None = None, *, attached: bool = False) -> str:
    who = f"The model {model}" if model else "This chat's model"
    done = "a message with it can't be sent" if attached else "the message was not sent"
    return (f"{who} cannot see images: it reads text only, so {done}. Remove the image, or load a model that "
            "has a vision projector (an mmproj file beside the GGUF: \"sees images\" in the Model tab).")


# ---- images in prompts -------------------------------------------------------------------------------
def with_images(history: list[dict], messages: list[Message], images_of: Callable[[int], list[AttachedImage]],
                sees: bool | None = None) -> list[dict]:
    """The history entries of user messages with images get `images` (sees True/None), or a note in their
    text where the model reads text only (sees False). User entries and user messages pair up in order."""
    users = iter([m for m in messages if m.role == "user"])
    out = []
    for entry in history:
        if entry.get("role") == "user":
            m = next(users, None)
            images = images_of(m.id) if m is not None else []
            if images:
                if sees is False:
                    notes = " ".join(f"[image: {im.label()}, not shown to this model]" for im in images)
                    entry = {**entry, "content": (entry["content"] + "\n" if entry["content"] else "") + notes}
                else:
                    entry = {**entry, "images": images}
        out.append(entry)
    return out


def _with_parts(history: list[dict], image_part) -> list[dict]:
    """History entries with `images` as content parts: the text first, then `image_part(image)` for each."""
    out = []
    for entry in history:
        images = entry.get("images")
        if not images:
            out.append(entry)
            continue
        parts = [{"type": "text", "text": entry["content"]}] if entry.get("content") else []
        parts += [image_part(im) for im in images]
        out.append({k: v for k, v in entry.items() if k != "images"} | {"content": parts})
    return out


def openai_messages(history: list[dict]) -> list[dict]:
    """History entries with `images` as OpenAI content parts (text first, then each image as a data: URL)."""
    return _with_parts(history, lambda im: {"type": "image_url", "image_url": {"url": im.data_url()}})


def engine_messages(history: list[dict]) -> list[dict]:
    """History entries with `images` as the engine's chat parts: {"type": "image", "image": PIL RGB image}
    (what engine's image-aware chat encoding takes), text part first."""
    return _with_parts(history, lambda im: {"type": "image", "image": im.pil()})


def png_bytes(width: int, height: int, colour: tuple[int, int, int]) -> bytes:
    """A plain PNG (for the demo screenshot and tests that need a picture)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buf, "PNG")
    return buf.getvalue()

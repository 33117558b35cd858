"""app.core.images on real files and a real SQLite store: attach checks, the message_images table (one
transaction with its message), prompts for remote servers and engines, exports with images."""
from __future__ import annotations

import io
import json
import sqlite3

import pytest
from PIL import Image

from app.core.export import export_chat
from app.core.images import (
    AttachedImage, ImageError, MessageImages, attach_bytes, attach_file, engine_messages, openai_messages, with_images,
)
from app.core.remote_backend import chat_body
from app.core.store import ChatSettings, Store
from app.core.store_errors import StoreWriteError
from engine.vision.image_input import decode_data_url


def picture(size=(30, 20), colour=(250, 10, 10), fmt="PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, fmt)
    return buf.getvalue()


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "data")
    yield s
    s.close()


def test_attach_checks_the_image_and_keeps_its_bytes(tmp_path):
    data = picture(fmt="JPEG")
    img = attach_bytes(data)
    assert (img.mime, img.width, img.height, img.data) == ("image/jpeg", 30, 20, data)
    assert img.label() == "30x20 JPEG"
    path = tmp_path / "cat.png"
    path.write_bytes(picture()[:70])  # truncated
    with pytest.raises(ImageError, match="cat.png: the image data is corrupt or truncated"):
        attach_file(path)
    path.write_bytes(b"not a picture")
    with pytest.raises(ImageError, match="cat.png: the data is not an image"):
        attach_file(path)
    with pytest.raises(ImageError, match="cannot read missing.png"):
        attach_file(tmp_path / "missing.png")


def test_images_are_stored_with_their_message_in_one_transaction(store, tmp_path):
    chat = store.create_chat()
    images = MessageImages(store)
    a, b = attach_bytes(picture()), attach_bytes(picture((8, 8), (0, 0, 255), "GIF"))
    m = images.add_message(chat.id, "user", "look", [a, b])
    reopened = Store.open(tmp_path / "data")  # a second connection: what is on disk
    try:
        assert MessageImages(reopened).of(m.id) == [a, b]
        assert [r[0] for r in reopened._db.execute("SELECT ordinal FROM message_images WHERE message_id=?", (m.id,))] == [0, 1]
    finally:
        reopened.close()
    # a failing image insert takes its message with it: nothing half-written
    before = len(store.messages(chat.id))
    bad = AttachedImage("image/png", None, 1, 1)  # NOT NULL bytes: the insert fails
    with pytest.raises((sqlite3.IntegrityError, StoreWriteError)):
        images.add_message(chat.id, "user", "half", [a, bad])
    assert len(store.messages(chat.id)) == before
    # deleting the chat removes its images
    store.delete_chat(chat.id)
    assert images.of(m.id) == []


def test_history_carries_images_or_says_they_are_unseen(store):
    chat = store.create_chat()
    images = MessageImages(store)
    img = attach_bytes(picture())
    first = images.add_message(chat.id, "user", "what is this?", [img])
    store.add_message(chat.id, "assistant", "a red box")
    second = images.add_message(chat.id, "user", "thanks", [])
    messages = store.messages(chat.id)
    history = [{"role": m.role, "content": m.content} for m in messages]
    seen = with_images(history, messages, images.of, sees=None)
    assert seen[0]["images"] == [img] and "images" not in seen[2] and second.id == messages[2].id
    unseen = with_images(history, messages, images.of, sees=False)
    assert unseen[0]["content"] == "what is this?\n[image: 30x20 PNG, not shown to this model]"
    assert "images" not in unseen[0]
    # a remote server gets OpenAI image_url parts with data: URLs that decode to the same picture
    body = chat_body("m", seen, ChatSettings(system_prompt="Be brief."))
    parts = body["messages"][1]["content"]
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert parts[0] == {"type": "text", "text": "what is this?"} and parts[1]["type"] == "image_url"
    assert decode_data_url(parts[1]["image_url"]["url"]).getpixel((3, 3)) == (250, 10, 10)
    assert body["messages"][2] == {"role": "assistant", "content": "a red box"}
    json.dumps(body)  # the body travels as JSON
    assert openai_messages([{"role": "user", "content": "", "images": [img]}])[0]["content"][0]["type"] == "image_url"
    # an engine that sees images gets PIL parts
    parts = engine_messages(seen)[0]["content"]
    assert parts[0]["type"] == "text" and parts[1]["image"].size == (30, 20) and parts[1]["image"].mode == "RGB"


def test_export_keeps_images(store, tmp_path):
    chat = store.create_chat("Pictures")
    images = MessageImages(store)
    img = attach_bytes(picture(colour=(0, 200, 0)))
    images.add_message(chat.id, "user", "see this", [img])
    store.add_message(chat.id, "assistant", "green")
    md = export_chat(store, chat.id, tmp_path / "out" / "chat.md") if (tmp_path / "out").mkdir() is None else None
    text = md.read_text()
    assert "![image 1: 30x20 PNG](chat_images/" in text
    link = text.split("](", 1)[1].split(")", 1)[0]
    assert (md.parent / link).read_bytes() == img.data
    doc = json.loads(export_chat(store, chat.id, tmp_path / "chat.json").read_text())
    entry = doc["messages"][0]["images"][0]
    assert entry["mime"] == "image/png" and (entry["width"], entry["height"]) == (30, 20)
    assert decode_data_url(entry["data_url"]).getpixel((1, 1)) == (0, 200, 0)
    assert "images" not in doc["messages"][1]

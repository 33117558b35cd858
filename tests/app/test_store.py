"""Store and export: real SQLite files on disk, reopened by a second connection."""
import json
from datetime import datetime
import sqlite3

import pytest

from app.core.export import export_chat, to_json, to_markdown
from app.core.store import ChatSettings, ReplyStats, Store


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path)
    yield s
    s.close()


def test_round_trip_after_reopen(tmp_path):
    s = Store.open(tmp_path / "data")
    settings = ChatSettings(system_prompt="Be terse.", temperature=0.3, top_k=7, seed=42, stop_strings=("END", "\n\n"))
    chat = s.create_chat("First", settings)
    s.add_message(chat.id, "user", "hello")
    stats = ReplyStats(state="done", prompt_tokens=12, cached_tokens=0, new_tokens=3, ttft_s=0.25, tokens_per_s=17.5, eos_reason="stop_token")
    reply = s.add_message(chat.id, "assistant", "", ReplyStats())
    s.update_reply(reply.id, "hi **there**", stats)
    other = s.create_chat("Second")
    s.rename_chat(other.id, "  Renamed   chat ")
    s.close()

    s2 = Store.open(tmp_path / "data")
    assert s2.recovered == []
    assert [c.title for c in s2.chats()] == ["Renamed chat", "First"]
    got = s2.chat(chat.id)
    assert got.settings == settings
    msgs = s2.messages(chat.id)
    assert [(m.role, m.content) for m in msgs] == [("user", "hello"), ("assistant", "hi **there**")]
    assert msgs[0].stats is None
    assert msgs[1].stats == stats
    assert s2.messages(other.id) == []
    s2.close()


def test_wal_mode_on_disk(tmp_path):
    Store.open(tmp_path).close()
    raw = sqlite3.connect(tmp_path / "pagedeck.sqlite3")
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_search_matches_titles_and_message_text(store):
    a = store.create_chat("Python questions")
    b = store.create_chat("Recipes")
    store.add_message(b.id, "user", "how long to boil an egg? 100% sure")
    store.create_chat("Empty")
    assert [c.id for c in store.chats("python")] == [a.id]
    assert [c.id for c in store.chats("EGG")] == [b.id]
    assert [c.id for c in store.chats("100%")] == [b.id]  # % is literal, not a wildcard
    assert store.chats("nothing like this") == []
    assert len(store.chats()) == 3


def test_delete_cascades_and_unknown_ids_raise(store):
    chat = store.create_chat("x")
    m = store.add_message(chat.id, "assistant", "partial")
    store.delete_chat(chat.id)
    assert store.chats() == []
    with pytest.raises(KeyError, match="no chat"):
        store.chat(chat.id)
    with pytest.raises(KeyError, match="no message"):
        store.update_reply(m.id, "x", ReplyStats())
    with pytest.raises(KeyError, match="no chat"):
        store.rename_chat(999, "y")


def test_running_replies_become_interrupted_on_reopen(tmp_path):
    s = Store.open(tmp_path)
    chat = s.create_chat("x")
    s.add_message(chat.id, "user", "q")
    m = s.add_message(chat.id, "assistant", "")
    s.update_reply(m.id, "half a rep", ReplyStats(state="streaming", new_tokens=4))
    s.close()
    s2 = Store.open(tmp_path)
    assert s2.recovered == [m.id]
    reply = s2.messages(chat.id)[-1]
    assert reply.content == "half a rep" and reply.stats.state == "interrupted" and reply.stats.new_tokens == 4
    s2.close()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"seed": -5}, "seed"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"stop_strings": ("",)}, "stop_strings"),
    ],
)
def test_bad_settings_name_the_field(store, kwargs, field):
    with pytest.raises(ValueError, match=field):
        store.create_chat("x", ChatSettings(**kwargs))


def test_bad_input_is_rejected(store):
    chat = store.create_chat("x")
    with pytest.raises(ValueError, match="role"):
        store.add_message(chat.id, "system", "no")
    with pytest.raises(ValueError, match="reply state"):
        ReplyStats(state="thinking")
    with pytest.raises(ValueError, match="title"):
        store.create_chat("   ")
    with pytest.raises(sqlite3.IntegrityError):
        store.add_message(12345, "user", "orphan")


def _sample(store):
    chat = store.create_chat("Export me", ChatSettings(system_prompt="SYS"))
    store.add_message(chat.id, "user", "What is `x`?")
    r = store.add_message(chat.id, "assistant", "")
    store.update_reply(r.id, "```python\nx = 1\n```", ReplyStats(state="done", prompt_tokens=9, cached_tokens=4, new_tokens=6, ttft_s=0.1, tokens_per_s=20.0))
    return chat


def test_export_markdown(store, tmp_path):
    chat = _sample(store)
    path = export_chat(store, chat.id, tmp_path / "out.md")
    text = path.read_text()
    assert text.startswith("# Export me\n")
    assert "## System\n\nSYS" in text
    assert text.index("## User\n\nWhat is `x`?") < text.index("## Assistant\n\n```python\nx = 1\n```")
    assert "prompt 9 tok" in text and "cached 4 tok" in text and "20.0 tok/s" in text and "TTFT 100 ms" in text
    stamp = datetime.fromisoformat(text.split("*Exported ", 1)[1].split(" ", 1)[0]).timestamp()
    assert text == to_markdown(store.chat(chat.id), store.messages(chat.id), exported_at=stamp)


def test_export_json(store, tmp_path):
    chat = _sample(store)
    doc = json.loads(export_chat(store, chat.id, tmp_path / "out.json").read_text())
    assert doc["format"] == "pagedeck-chat" and doc["title"] == "Export me"
    assert doc["settings"]["system_prompt"] == "SYS"
    assert [(m["role"], m["content"]) for m in doc["messages"]] == [("user", "What is `x`?"), ("assistant", "```python\nx = 1\n```")]
    assert "stats" not in doc["messages"][0]
    assert doc["messages"][1]["stats"]["cached_tokens"] == 4
    stamp = datetime.fromisoformat(doc["exported"]).timestamp()
    assert json.loads(to_json(store.chat(chat.id), store.messages(chat.id), exported_at=stamp)) == doc


def test_export_rejects_unknown_suffix(store, tmp_path):
    chat = _sample(store)
    with pytest.raises(ValueError, match=r"\.md or \.json"):
        export_chat(store, chat.id, tmp_path / "out.txt")

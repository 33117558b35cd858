"""The message tree (versions of a reply, branches): schema-1 migration, versions, branches, export."""
import json
import shutil
from pathlib import Path

from app.core.export import export_chat
from app.core.store import ReplyStats, Store

SCHEMA1 = Path(__file__).resolve().parents[1] / "data" / "pagedeck_schema1.sqlite3"


def test_a_schema1_store_opens_as_a_tree_showing_what_it_showed(tmp_path):
    shutil.copy(SCHEMA1, tmp_path / "pagedeck.sqlite3")
    s = Store.open(tmp_path)
    assert s._db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert s.recovered == [9]  # the reply streaming when schema-1 was written is interrupted, text kept
    pirate = s.messages(1)
    assert [m.content for m in pirate] == ["Hello there", "Arr, **hello**!", "Tell me about ships", "Ships be"]
    assert [m.parent_id for m in pirate] == [None, 1, 2, 3]
    code = s.messages(3)
    assert code[-1].content == "half a rep" and code[-1].stats.state == "interrupted"
    assert s.messages(4) == []
    s.close()


def test_versions_branches_and_branch_export(tmp_path):
    s = Store.open(tmp_path)
    chat = s.create_chat("Trip")
    q = s.add_message(chat.id, "user", "Where to?")
    a1 = s.add_message(chat.id, "assistant", "Lisbon", ReplyStats(state="done"))
    a2 = s.add_message(chat.id, "assistant", "Porto", ReplyStats(state="done"), parent_id=q.id)
    assert s.alternatives(a1.id) == [a1.id, a2.id]
    assert [m.content for m in s.messages(chat.id)] == ["Where to?", "Porto"]
    s.select(chat.id, a1.id)
    assert [m.content for m in s.messages(chat.id)] == ["Where to?", "Lisbon"]
    branch = s.branch(chat.id, a1.id)
    assert branch.branch_of == a1.id
    s.add_message(branch.id, "user", "And food?")
    assert [m.content for m in s.messages(branch.id)] == ["Where to?", "Lisbon", "And food?"]
    assert [m.content for m in s.messages(chat.id)] == ["Where to?", "Lisbon"]  # the source is untouched
    doc = json.loads(export_chat(s, branch.id, tmp_path / "b.json").read_text())
    assert doc["branched_from"] == "Trip" and [m["content"] for m in doc["messages"]][-1] == "And food?"
    assert 'Branched from "Trip"' in export_chat(s, branch.id, tmp_path / "b.md").read_text()
    s.close()
    s2 = Store.open(tmp_path)  # the tree is on disk
    assert s2.alternatives(a2.id) == [a1.id, a2.id] and s2.chat(branch.id).branch_of == a1.id
    s2.close()

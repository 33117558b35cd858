"""Transcript rendering: the incremental streaming path shows what a whole Markdown import shows."""
import random

import pytest
from PySide6.QtGui import QTextDocument, QTextFormat

from app.chat.transcript import Transcript, stable_prefix
from app.core.formatting import stats_text
from app.core.store import Message, ReplyStats

TOKENS = ["Hello", " world", ",", " this", " is", " **bold**", " *it*", " `code`", "\n\n", "\n", "- item", "1. first",
          "```python\n", "print(1)", "\n```", "# Title", " text", " a_b", " [link](http://x.y)", ":", " more", "  "]


def test_stable_prefix():
    assert stable_prefix("") == 0
    assert stable_prefix("one paragraph") == 0
    assert stable_prefix("a\n\nb") == 3
    assert stable_prefix("a\n\nb\n\nc") == 6
    assert stable_prefix("```\nx\n\ny") == 0  # blank line inside an open fence
    assert stable_prefix("```\nx\n```\n\nz") == 11
    assert stable_prefix("~~~\n```\n\n~~~\n\nz") == 14  # a different fence char does not close
    assert stable_prefix("a\n\nb\n\nc", start=3) == 6


def _text(doc):
    lines = [ln.rstrip() for ln in doc.toPlainText().split("\n")]
    return "\n".join(ln for ln in lines if ln)


def _whole(message, stats, actions=(("copy", "copy"),)):
    doc = QTextDocument()
    t = Transcript(doc)
    t.append(message, list(actions), stats)
    return doc


@pytest.mark.parametrize("seed", range(6))
def test_streaming_render_matches_a_whole_import(qapp, seed):
    rng = random.Random(seed)
    doc = QTextDocument()
    t = Transcript(doc)
    msg = Message(7, 1, "assistant", "", 0.0)
    t.begin_stream(msg, [("copy", "copy")])
    text = ""
    for i in range(120):
        text += rng.choice(TOKENS)
        stats = ReplyStats(state="streaming", new_tokens=i + 1)
        t.update_stream(text, stats)
        assert _text(doc) == _text(_whole(Message(7, 1, "assistant", text, 0.0), stats)), f"step {i}: {text!r}"
    msg.content = text
    done = ReplyStats(state="done", new_tokens=120, tokens_per_s=9.5)
    t.end_stream(msg, [("copy", "copy")], done)
    assert doc.toPlainText() == _whole(msg, done).toPlainText()  # exactly, whitespace included
    assert t.streaming_id is None


def test_code_blocks_are_marked_and_styled_while_streaming_and_after(qapp):
    doc = QTextDocument()
    t = Transcript(doc)
    msg = Message(1, 1, "assistant", "", 0.0)
    t.begin_stream(msg, [])
    text = "Here:\n\n```python\ndef f():\n    return 1\n"
    t.update_stream(text, ReplyStats(state="streaming"))

    def code_lines():
        out, block = [], doc.begin()
        while block.isValid():
            if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
                assert block.blockFormat().background().color().alpha() > 0
                out.append(block.text())
            block = block.next()
        return out

    assert code_lines() == ["def f():", "    return 1"]
    msg.content = text + "```\n\nDone."
    t.end_stream(msg, [], ReplyStats(state="done"))
    assert code_lines() == ["def f():", "    return 1"]
    assert "Done." in doc.toPlainText() and "```" not in doc.toPlainText()
    assert doc.toHtml() == _whole(msg, ReplyStats(state="done"), ()).toHtml()


def test_header_links_and_stats_line(qapp):
    doc = QTextDocument()
    t = Transcript(doc)
    t.append(Message(3, 1, "user", "hi", 0.0), [("prev", "‹"), ("", "2/2"), ("edit", "edit"), ("copy", "copy")])
    html = doc.toHtml()
    assert 'href="pd:prev/3"' in html and "2/2" in html  # the version arrows stay in the header
    assert 'href="pd:edit/3"' not in html  # the actions are the hover bar's icon buttons
    assert t.bar_actions(3) == [("edit", "edit"), ("copy", "copy")]
    assert t.message_at(doc.characterCount() - 1) == 3
    s = ReplyStats(state="prefill", progress=0.42, prompt_tokens=300, cached_tokens=256)
    assert stats_text(s) == "prefill 42% · prompt 300 tok · cached 256 tok"
    s = ReplyStats(state="done", prompt_tokens=10, cached_tokens=0, new_tokens=5, ttft_s=0.125, tokens_per_s=31.25)
    assert stats_text(s) == "done · prompt 10 tok · cached 0 tok · 5 new tok · TTFT 125 ms · 31.2 tok/s"
    assert stats_text(ReplyStats(state="done", new_tokens=48, eos_reason="repetition")) == \
        "stopped: repeating itself · 48 new tok"  # the engine's loop guard ended it
    assert not doc.isUndoRedoEnabled()


def test_misuse_raises(qapp):
    t = Transcript(QTextDocument())
    with pytest.raises(RuntimeError, match="begin_stream"):
        t.update_stream("x", ReplyStats())
    t.begin_stream(Message(1, 1, "assistant", "", 0.0), [])
    with pytest.raises(RuntimeError, match="still streaming"):
        t.append(Message(2, 1, "user", "y", 0.0), [])
    with pytest.raises(RuntimeError, match="not streaming"):
        t.end_stream(Message(5, 1, "assistant", "", 0.0), [], ReplyStats())

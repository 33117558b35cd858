"""Code blocks in replies: Pygments highlighting, and a Copy link that puts the block's exact text on the
real clipboard (clicked with the mouse in a real chat pane)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QTextCursor, QTextDocument, QTextFormat
from PySide6.QtWidgets import QApplication

from app.chat.code_blocks import COPY_VERB, fences
from app.chat.transcript import CODE_BACKGROUND, Transcript
from app.core.store import Message, ReplyStats
from tests.app.support import loop, make_window, run, store  # noqa: F401 - fixtures
from tests.app.test_theme import _system_look_after, contrast  # noqa: F401 - fixture

PY = '\tdef f(a):  \n\n\treturn "<b>&amp;" + \'\\n\'  # note\n'  # tabs, trailing blanks, markup-ish text
REPLY = f"Try this:\n\n```python\n{PY}```\n\nand\n\n~~~sh\necho $HOME\n~~~\n\nDone."


def _code_links(doc: QTextDocument) -> list[tuple[str, int]]:
    """(href, document position) of every code Copy link, in document order."""
    out, block = [], doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.charFormat().anchorHref().startswith(f"pd:{COPY_VERB}/"):
                out.append((frag.charFormat().anchorHref(), frag.position()))
            it += 1
        block = block.next()
    return out


def _code_blocks(doc: QTextDocument) -> list[list]:
    """Runs of code-tagged blocks."""
    runs, block, prev = [], doc.begin(), False
    while block.isValid():
        code = block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)
        if code and not prev:
            runs.append([])
        if code:
            runs[-1].append(block)
        prev, block = code, block.next()
    return runs


def test_fences_are_read_exactly_and_only_when_closed():
    assert fences(REPLY)[0].code == PY[:-1] and fences(REPLY)[0].language == "python"
    assert fences(REPLY)[1].code == "echo $HOME" and fences(REPLY)[1].language == "sh"
    assert fences("```py\nstill streaming\n") == []  # open: Qt shows it as it streams, nothing to copy yet
    assert [f.code for f in fences("````\n```\ninner\n```\n````\n")] == ["```\ninner\n```"]
    assert [f.code for f in fences("- item\n\n  ```\n  x = 1\n  ```\n")] == ["x = 1"]
    assert fences("    indented code\n") == []


def test_code_is_highlighted_with_its_exact_text(qapp):
    doc = QTextDocument()
    t = Transcript(doc)
    t.append(Message(1, 1, "assistant", REPLY, 0.0), [])
    runs = _code_blocks(doc)
    assert ["\n".join(b.text() for b in run) for run in runs] == [PY[:-1], "echo $HOME"]  # tabs kept
    colours = set()
    for block in runs[0]:
        assert block.blockFormat().background().color() == CODE_BACKGROUND
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            assert fmt.fontFixedPitch()
            if fmt.hasProperty(QTextFormat.Property.ForegroundBrush):
                colours.add(fmt.foreground().color().name())
            it += 1
    assert len(colours) >= 3, colours  # keyword, string, comment... not one flat colour
    assert "Done." in doc.toPlainText() and "```" not in doc.toPlainText()


def test_streaming_reply_gets_copy_links_once_its_fence_closes(qapp):
    doc = QTextDocument()
    t = Transcript(doc)
    msg = Message(3, 1, "assistant", "", 0.0)
    t.begin_stream(msg, [])
    head = f"Try this:\n\n```python\n{PY}"
    t.update_stream(head, ReplyStats(state="streaming"))
    assert _code_links(doc) == []  # still open
    t.update_stream(head + "```\n\nmore", ReplyStats(state="streaming"))
    [(href, _)] = _code_links(doc)
    assert t.code_blocks.text(int(href.rpartition("/")[2])) == PY[:-1]
    for _ in range(5):  # re-rendering the same block reuses its id
        t.update_stream(head + "```\n\nmore words", ReplyStats(state="streaming"))
    msg.content = head + "```\n\nmore words"
    t.end_stream(msg, [], ReplyStats(state="done"))
    assert [h for h, _ in _code_links(doc)] == [href]


def _click(qtbot, view, position: int) -> None:
    """A real left click in the middle of the link that starts at document `position`."""
    cursor = QTextCursor(view.document())
    cursor.setPosition(position + 2)
    view.setTextCursor(cursor)
    view.ensureCursorVisible()
    assert view.anchorAt(view.cursorRect(cursor).center()).startswith(f"pd:{COPY_VERB}/")
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.cursorRect(cursor).center())


def test_copy_link_puts_the_exact_code_on_the_clipboard(qtbot, loop, store):  # noqa: F811
    async def body():
        window = make_window(qtbot, store)
        pane = window.new_chat()
        for role, text in (("user", "show me"), ("assistant", REPLY)):
            m = store.add_message(pane.session.chat_id, role, text,
                                  ReplyStats(state="done") if role == "assistant" else None)
            pane.session.messages.append(m)
        pane.rebuild()
        links = _code_links(pane.view.document())
        assert len(links) == 2
        for (_, pos), expected in zip(links, (PY[:-1], "echo $HOME")):
            QGuiApplication.clipboard().setText("before")
            _click(qtbot, pane.view, pos)
            assert QGuiApplication.clipboard().text() == expected

    run(loop, body())


def test_dark_theme_recolours_open_code_and_keeps_it_readable(qtbot, loop, store):  # noqa: F811
    async def body():
        window = make_window(qtbot, store)
        pane = window.new_chat()
        m = store.add_message(pane.session.chat_id, "assistant", REPLY, ReplyStats(state="done"))
        pane.session.messages.append(m)
        pane.rebuild()

        def code_colours() -> list[QColor]:
            out = []
            for block in _code_blocks(pane.view.document())[0]:
                it = block.begin()
                while not it.atEnd():
                    fmt = it.fragment().charFormat()
                    if fmt.hasProperty(QTextFormat.Property.ForegroundBrush) and it.fragment().text().strip():
                        out.append(fmt.foreground().color())
                    it += 1
            return out

        light = code_colours()
        window.theme.set_mode("dark")
        QApplication.processEvents()
        dark = code_colours()
        assert [c.name() for c in dark] != [c.name() for c in light]  # re-highlighted for the dark palette
        base = pane.view.palette().color(pane.view.palette().ColorRole.Base)
        a = CODE_BACKGROUND.alphaF()
        behind = QColor.fromRgbF(*(a * x + (1 - a) * y for x, y in zip(
            CODE_BACKGROUND.getRgbF()[:3], base.getRgbF()[:3])))
        assert min(contrast(c, behind) for c in dark) >= 3.0  # every highlighted token readable on dark
        assert _code_links(pane.view.document())  # the Copy links survive the rebuild

    run(loop, body())


def test_a_reply_that_opens_with_code_or_a_heading_keeps_its_first_block(qapp):
    """Qt's importer drops the format of the first block it imports; the transcript restores it."""
    doc = QTextDocument()
    t = Transcript(doc)
    t.append(Message(1, 1, "assistant", "```python\nx = 1\ny = 2\n```\n", 0.0), [])
    assert ["\n".join(b.text() for b in run) for run in _code_blocks(doc)] == ["x = 1\ny = 2"]
    t.append(Message(2, 1, "assistant", "# Title\n\ntext", 0.0), [])
    block = doc.begin()
    while block.text() != "Title":
        block = block.next()
    assert block.blockFormat().headingLevel() == 1

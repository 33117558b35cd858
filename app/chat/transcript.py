"""A chat transcript in one QTextDocument, with Qt's own Markdown importer (md4c, GitHub dialect).

Streaming cost is what matters: re-importing a whole long reply at 20 Hz in eight panes would stall the
UI thread. So a streaming reply is split at its last paragraph break outside a code fence: the stable
part above is appended once and never touched again; only the open tail (last paragraph or open code
block) and the stats line are re-imported on each update. When the reply ends it is rendered whole once,
so constructs that span paragraphs come out exactly right.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass

from PySide6.QtCore import QUrl
from PySide6.QtGui import (
    QColor, QFont, QGuiApplication, QPalette, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat, QTextFrame,
    QTextFrameFormat, QTextImageFormat,
)

from app.chat.attachments import thumbnail

from app.chat.code_blocks import CODE_BACKGROUND, CodeBlocks
from app.core.formatting import stats_text
from app.preferences.contrast import readable
from app.preferences.design_tokens import SPACE, TYPE, css, roles
from app.preferences.theme import is_dark, quiet_text

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
THUMB = 160  # px: a message's images as thumbnails under its header
_FIRST_BLOCK_MARKUP = re.compile(r" {0,3}(`{3,}|~{3,}|#{1,6}(\s|$))")  # a fence or a heading first
_MARKUP = re.compile(r"[\\`*_\[\]<>#|~!&:\n\r]")  # text with none of these renders as itself mid-paragraph
# A message's actions, shown as icon buttons over the message (app.chat.message_actions), not in its header;
# the header keeps the version arrows ‹ 1/3 › only.
BAR_VERBS = ("edit", "copy", "branch", "regen", "continue")


def _fence_scan(text: str, start: int = 0) -> tuple[int, int | None]:
    """Scan `text` from `start` (a point outside any fence). Returns (stable, open_fence_at): the end of
    the last paragraph break outside a fence, and where a still-open fence starts (None if none)."""
    stable = start
    fence: str | None = None
    fence_at: int | None = None
    pos = start
    for line in text[start:].splitlines(keepends=True):
        m = _FENCE.match(line)
        if m and not (m.group(1)[0] == "`" and "`" in line[m.end():]):  # backticks in the info string: inline code
            mark = m.group(1)
            if fence is None:
                fence, fence_at = mark, pos
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip().strip(mark[0]):
                fence = fence_at = None
        pos += len(line)
        if fence is None and line.strip() == "" and line.endswith("\n"):
            stable = pos
    return stable, fence_at


def stable_prefix(text: str, start: int = 0) -> int:
    """Length of the part of `text` that later tokens cannot change: up to its last paragraph break
    ("\\n\\n") that lies outside a fenced code block."""
    return _fence_scan(text, start)[0]


@dataclass
class _OpenCode:
    fence_at: int  # offset of the opening fence line in the tail
    lines: int  # complete code lines appended so far
    partial_pos: int  # document position after them


@dataclass
class _Stream:
    message_id: int
    stable_len: int  # chars of the reply already appended for good
    tail_pos: int  # document position where the re-rendered tail starts
    code: _OpenCode | None = None  # a code block still streaming: appended line by line
    tail_text: str = ""  # the Markdown of the tail as last rendered
    note: str = ""  # shown after the stats: thinking (tokens, time), a tool call waiting


class Transcript:
    """Owns the document of a QTextBrowser: messages appended in order, the last one may stream."""

    def __init__(self, document: QTextDocument):
        self.doc = document
        document.setUndoRedoEnabled(False)  # a streaming transcript would grow the undo stack forever
        self._stream: _Stream | None = None
        self._header_pos = 0
        self._into: QTextFrame | None = None  # the user message's bubble while it is being written
        self.headers: dict[int, tuple[int, list[tuple[str, str]]]] = {}  # message id -> (header position, actions)
        mono = QFont("monospace")
        mono.setStyleHint(QFont.StyleHint.Monospace)
        self._code_block = QTextBlockFormat()
        self._code_block.setBackground(CODE_BACKGROUND)
        self._code_block.setProperty(QTextFormat.Property.BlockCodeFence, "`")
        self._code_char = QTextCharFormat()
        self._code_char.setFontFamilies([mono.family(), "monospace"])
        self._code_char.setFontFixedPitch(True)
        self.code_blocks = CodeBlocks(document, self._code_block, self._code_char)

    @property
    def streaming_id(self) -> int | None:
        return self._stream.message_id if self._stream else None

    def clear(self) -> None:
        self.doc.clear()
        self._stream = None
        self.headers.clear()

    def message_at(self, position: int) -> int | None:
        """The id of the message the document `position` lies in (None above the first one)."""
        found = None
        for message_id, (start, _actions) in self.headers.items():  # in document order
            if start > position:
                break
            found = message_id
        return found

    def bar_actions(self, message_id: int) -> list[tuple[str, str]]:
        """The message's actions the hover bar shows as icon buttons (verb, label)."""
        return [(v, label) for v, label in self.headers.get(message_id, (0, []))[1] if v in BAR_VERBS]

    def append(self, message, actions: list[tuple[str, str]], stats=None,
               thinking: tuple[str, str, bool] | None = None, images: list | None = None,
               images_note: str = "") -> None:
        """A finished message: header with action links, its images as thumbnails (with a note: their
        size, tokens), its thinking as a collapsible section (label, text, expanded), Markdown body, stats
        line (assistant; a reply's images_note, about the images its prompt held, follows it)."""
        self._finish_stream()
        if message.role == "user":  # the user's turns sit in a bubble of their own colour, indented
            self._into = self._bubble()
        try:
            self._header(message, actions)
            if images:
                self._images(message.id, images, images_note)
            if thinking is not None:
                self._thinking(message.id, *thinking)
            self._markdown(message.content)
            if stats is not None:
                self._stats(stats, "" if images else images_note)
        finally:
            self._into = None

    def begin_stream(self, message, actions: list[tuple[str, str]]) -> None:
        self._finish_stream()
        self._header(message, actions)
        self._stream = _Stream(message.id, 0, self._end())

    def update_stream(self, text: str, stats, note: str = "") -> None:
        """Re-import only the open tail; append any newly stable paragraphs once."""
        s = self._stream
        if s is None:
            raise RuntimeError("update_stream() without begin_stream()")
        s.note = note
        edit = QTextCursor(self.doc)
        edit.beginEditBlock()  # one relayout for the whole update, not one per insert
        try:
            self._update_stream(s, text, stats)
        finally:
            edit.endEditBlock()

    def _update_stream(self, s: _Stream, text: str, stats) -> None:
        stable, fence_at = _fence_scan(text, s.stable_len)
        if stable == s.stable_len and fence_at is None and self._append_plain(s, text[stable:], stats):
            return
        if stable > s.stable_len:
            self._cut(s.tail_pos)
            s.code = None
            self._markdown(text[s.stable_len:stable])
            s.stable_len = stable
            s.tail_pos = self._end()
        tail = s.tail_text = text[s.stable_len:]
        if fence_at is None:
            self._cut(s.tail_pos)
            s.code = None
            if tail.strip():
                self._markdown(tail)
        else:  # an open code block: a long one must not be re-imported per update
            fence_at -= s.stable_len
            if s.code is None or s.code.fence_at != fence_at:
                self._cut(s.tail_pos)
                if tail[:fence_at].strip():
                    self._markdown(tail[:fence_at])
                s.code = _OpenCode(fence_at, 0, self._end())
            else:
                self._cut(s.code.partial_pos)
            body = tail[fence_at:].partition("\n")[2].split("\n")
            for line in body[s.code.lines:-1]:
                self._code_line(line)
            s.code.lines = len(body) - 1
            s.code.partial_pos = self._end()
            if body[-1]:
                self._code_line(body[-1])
        self._stats(stats)

    def end_stream(self, message, actions: list[tuple[str, str]], stats, thinking=None, images=None,
                   images_note: str = "") -> None:
        """Render the finished reply whole, replacing its header and incremental pieces."""
        if self._stream is None or self._stream.message_id != message.id:
            raise RuntimeError(f"end_stream() for message {message.id}, which is not streaming")
        self._cut(self._header_pos)
        self._stream = None
        self.headers.pop(message.id, None)
        self.append(message, actions, stats, thinking, images, images_note)

    # --- document building ---------------------------------------------------------------------

    def _end(self) -> int:
        return self.doc.characterCount() - 1

    def _cursor(self) -> QTextCursor:
        if self._into is not None:  # inside a bubble: after what it holds
            c = self._into.lastCursorPosition()
            if c.position() > self._into.firstPosition():
                c.insertBlock(QTextBlockFormat(), QTextCharFormat())
            return c
        c = QTextCursor(self.doc)
        c.movePosition(QTextCursor.MoveOperation.End)
        if c.block().length() == 1 and c.block().previous().isValid() and \
                isinstance(self.doc.frameAt(c.block().previous().position()), QTextFrame) and \
                self.doc.frameAt(c.block().previous().position()) is not self.doc.rootFrame():
            c.setBlockFormat(QTextBlockFormat())  # the empty line Qt keeps after a bubble: written into
            c.setCharFormat(QTextCharFormat())
        elif self._end() > 0:  # a fresh block with plain formats, so code styling never leaks onwards
            c.insertBlock(QTextBlockFormat(), QTextCharFormat())
        return c

    def _bubble(self) -> QTextFrame:
        """A frame at the end of the document in the user bubble's colour (tokens), padded and indented."""
        fmt = QTextFrameFormat()
        fmt.setBackground(QColor(*roles(is_dark()).user_bubble))
        fmt.setPadding(SPACE["sm"])
        fmt.setTopMargin(SPACE["md"])
        fmt.setLeftMargin(SPACE["xl"] * 2)
        fmt.setBottomMargin(SPACE["xs"])
        fmt.setBorder(0)
        c = QTextCursor(self.doc)
        c.movePosition(QTextCursor.MoveOperation.End)
        if self._end() == 0:  # Qt keeps an empty line before a frame: at the top it would push the bubble down
            line = QTextBlockFormat()
            line.setLineHeight(0, QTextBlockFormat.LineHeightTypes.FixedHeight.value)
            c.setBlockFormat(line)
        return c.insertFrame(fmt)

    def _cut(self, pos: int) -> None:
        c = QTextCursor(self.doc)
        c.setPosition(pos)
        c.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        c.removeSelectedText()

    def _finish_stream(self) -> None:
        if self._stream is not None:
            raise RuntimeError(f"message {self._stream.message_id} is still streaming; end it first")

    def _header(self, message, actions: list[tuple[str, str]]) -> None:
        self._header_pos = self._end()
        c = self._cursor()
        self.headers[message.id] = (c.block().position(), list(actions))
        fmt = QTextBlockFormat()
        fmt.setTopMargin(0 if self._into is not None else SPACE["md"])
        c.setBlockFormat(fmt)
        who = "You" if message.role == "user" else "Assistant"
        behind = roles(is_dark()).user_bubble if message.role == "user" else self.doc_base()
        label = css(readable(roles(is_dark()).role_label, behind))
        links = " ".join(f'<a href="pd:{verb}/{message.id}">{html.escape(label)}</a>' if verb else html.escape(label)
                         for verb, label in actions if verb not in BAR_VERBS)
        c.insertHtml(f'<b style="color: {label}">{who}</b>&nbsp;&nbsp;<small>{links}</small>')

    @staticmethod
    def doc_base() -> tuple[int, int, int]:
        """The transcript's background: the palette's Base."""
        return QGuiApplication.palette().color(QPalette.ColorRole.Base).getRgb()[:3]

    def _markdown(self, text: str) -> None:
        c = self._cursor()
        start = c.block().position()
        c.insertMarkdown(text)
        self._restore_first_block(start, text)
        self._style_code(start, c.position())
        self.code_blocks.decorate(text, start)  # closed fences: highlighted, with a Copy link

    def _restore_first_block(self, start: int, text: str) -> None:
        """Qt merges the first imported block into the cursor's block and drops its format, so text that
        opens with a code fence or a heading would lose it: re-read that first block alone and restore it."""
        if not _FIRST_BLOCK_MARKUP.match(text):
            return
        ref = QTextDocument()
        ref.setMarkdown(text.split("\n\n", 1)[0])
        fmt = ref.firstBlock().blockFormat()
        if fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.headingLevel():
            QTextCursor(self.doc.findBlock(start)).setBlockFormat(fmt)

    def _append_plain(self, s: _Stream, tail: str, stats) -> bool:
        """Most tokens are plain words inside a plain paragraph: insert them as text, no re-import.
        Anything Markdown could read differently (syntax characters, a new line) takes the full path."""
        old = s.tail_text
        if s.code is not None or not old.rpartition("\n")[2].strip() or not tail.startswith(old):
            return False  # (the delta would start a line, where "-", "1." or spaces mean something)
        delta = tail[len(old):]
        if _MARKUP.search(delta):
            return False
        block = self.doc.lastBlock().previous()  # the tail's last block; the stats line follows it
        fmt = block.blockFormat()
        if fmt.headingLevel() or fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or block.textList():
            return False
        c = QTextCursor(block)
        if c.currentTable() is not None:
            return False
        c.movePosition(QTextCursor.MoveOperation.EndOfBlock)
        c.insertText(delta, QTextCharFormat())
        s.tail_text = tail
        c = QTextCursor(self.doc.lastBlock())
        c.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
        c.insertText(self._stats_line(stats), self._stats_format())
        return True

    def _stats_format(self) -> QTextCharFormat:
        fmt = QTextCharFormat()
        quiet = quiet_text()  # AA on the theme's background, and on the user's bubble inside one
        if self._into is not None:
            quiet = QColor(*readable(quiet.getRgb()[:3], roles(is_dark()).user_bubble))
        fmt.setForeground(quiet)
        fmt.setFontPointSize(max(6.0, self.doc.defaultFont().pointSizeF() * TYPE["caption"]))
        return fmt

    def _stats_line(self, stats) -> str:
        note = self._stream.note if self._stream is not None else ""
        return stats_text(stats) + (f" · {note}" if note else "")

    def _stats(self, stats, extra: str = "") -> None:
        self._cursor().insertText(self._stats_line(stats) + (f" · {extra}" if extra else ""), self._stats_format())

    def _images(self, message_id: int, images: list, note: str) -> None:
        """Thumbnails in one line, each a document resource named pdimg:<message>/<n>."""
        c = self._cursor()
        for i, image in enumerate(images):
            q = thumbnail(image, THUMB)
            if q.isNull():
                c.insertText(f"[image: {image.label()}] ", self._stats_format())
                continue
            name = f"pdimg:{message_id}/{i}"
            self.doc.addResource(QTextDocument.ResourceType.ImageResource, QUrl(name), q)
            fmt = QTextImageFormat()
            fmt.setName(name)
            fmt.setWidth(q.width())
            fmt.setHeight(q.height())
            fmt.setToolTip(image.label())
            c.insertImage(fmt)
            c.insertText(" ")
        labels = ", ".join(image.label() for image in images)
        self._cursor().insertText(labels + (f" · {note}" if note else ""), self._stats_format())

    def _thinking(self, message_id: int, label: str, text: str, expanded: bool) -> None:
        """The thinking's one-line summary (a link that folds it open or shut) and, when open, its text."""
        c = self._cursor()
        arrow = "▾" if expanded else "▸"
        c.insertHtml(f'<a href="pd:think/{message_id}" style="color: {quiet_text().name()}; text-decoration: none">'
                     f'{arrow} {html.escape(label)}</a>')
        if expanded:
            for paragraph in text.split("\n\n"):
                c = self._cursor()
                fmt = QTextBlockFormat()
                fmt.setLeftMargin(SPACE["lg"])
                c.setBlockFormat(fmt)
                c.insertText(paragraph.strip(), self._stats_format())

    def _code_line(self, line: str) -> None:
        c = self._cursor()
        c.setBlockFormat(self._code_block)
        c.insertText(line, self._code_char)

    def _style_code(self, start: int, end: int) -> None:
        """Qt imports fenced code as plain blocks tagged with a fence property; give them a look."""
        block = self.doc.findBlock(start)
        while block.isValid() and block.position() <= end:
            if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
                c = QTextCursor(block)
                c.mergeBlockFormat(self._code_block)
                c.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
                c.mergeCharFormat(self._code_char)
            block = block.next()

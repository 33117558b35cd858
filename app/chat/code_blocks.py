"""Fenced code blocks in a transcript: syntax highlighting (Pygments) and a Copy link with the exact text.

Qt's Markdown importer keeps code but not exactly (it expands tabs to spaces) and cannot colour it. So
the code is taken from the Markdown itself, parsed by markdown-it (CommonMark, like Qt's md4c): each
fenced block Qt imported is replaced by a header line (language, Copy link) and the block's exact lines,
coloured token by token. The Copy link's id maps to that exact text; the same text always gets the same
id, so re-rendering a streaming reply's tail does not pile up entries. A style's token colours are made
for its own background, not the code block's: each is shaded just enough to reach WCAG AA on the block.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from functools import lru_cache

from markdown_it import MarkdownIt
from pygments.lexers import get_lexer_by_name, guess_lexer
from pygments.styles import get_style_by_name
from pygments.token import Token
from pygments.util import ClassNotFound
from PySide6.QtGui import (
    QColor, QFont, QGuiApplication, QPalette, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat,
)

from app.preferences.contrast import over, readable
from app.preferences.theme import is_dark, quiet_text

COPY_VERB = "code"  # links read pd:code/<id>
LIGHT_STYLE, DARK_STYLE = "default", "github-dark"
CODE_BACKGROUND = QColor(128, 128, 128, 40)  # a code block's, over the transcript's Base
_MD = MarkdownIt("commonmark")
_FENCE = QTextFormat.Property.BlockCodeFence


@dataclass(frozen=True)
class Fence:
    language: str
    code: str  # exact text, without the final newline


def _closed(tok, lines: list[str]) -> bool:
    """markdown-it runs an unclosed fence to the end of the text; a closed one ends on its closing fence."""
    if not tok.map or tok.map[1] - 1 <= tok.map[0]:
        return False
    line = lines[tok.map[1] - 1].lstrip(" >").rstrip()  # (inside a list or a quote too)
    return len(line) >= len(tok.markup) and set(line) == {tok.markup[0]}


def fences(markdown: str) -> list[Fence]:
    """Closed fenced code blocks of `markdown` in order. A fence still open (a streaming reply's last block)
    is left alone, as are indented code blocks (Qt does not tag those as code)."""
    out = []
    lines = markdown.split("\n")
    for tok in _MD.parse(markdown):
        if tok.type == "fence" and _closed(tok, lines):
            code = tok.content[:-1] if tok.content.endswith("\n") else tok.content
            out.append(Fence(tok.info.split()[0] if tok.info.strip() else "", code))
    return out


@lru_cache(maxsize=256)
def _tokens(language: str, code: str) -> tuple:
    """Pygments tokens of `code` (cached: a streaming reply re-renders its last closed block per update,
    and guessing an unlabelled block's language tries every lexer)."""
    exact = dict(stripnl=False, ensurenl=False)  # Pygments would trim blank edge lines and add a newline
    try:
        lexer = get_lexer_by_name(language, **exact) if language else guess_lexer(code, **exact)
    except ClassNotFound:
        lexer = get_lexer_by_name("text", **exact)
    return tuple(lexer.get_tokens(code))


@lru_cache(maxsize=None)
def token_formats(style_name: str, background: tuple[float, float, float]) -> dict:
    """Pygments token type -> QTextCharFormat for one style on one (r, g, b) background, each colour shaded
    to AA contrast on it (built once per style and background)."""
    style = get_style_by_name(style_name)
    out = {}
    for ttype, spec in style:
        fmt = QTextCharFormat()
        if spec["color"]:
            colour = QColor("#" + spec["color"]).getRgb()[:3]
            fmt.setForeground(QColor(*readable(colour, background)))
        if spec["bold"]:
            fmt.setFontWeight(QFont.Weight.Bold)
        if spec["italic"]:
            fmt.setFontItalic(True)
        out[ttype] = fmt
    return out


def code_background() -> tuple[float, float, float]:
    """What a code block's translucent background looks like over the app palette's Base (unrounded: a
    shade chosen to just reach AA on it must not miss by a rounding)."""
    base = QGuiApplication.palette().color(QPalette.ColorRole.Base).getRgb()[:3]
    return over(CODE_BACKGROUND.getRgb()[:3], CODE_BACKGROUND.alphaF(), base)


def _token_format(formats: dict, ttype) -> QTextCharFormat:
    while ttype not in formats and ttype is not Token:
        ttype = ttype.parent
    return formats.get(ttype, QTextCharFormat())


class CodeBlocks:
    """Decorates the code blocks of one transcript document and remembers their text for Copy."""

    def __init__(self, document: QTextDocument, block_format: QTextBlockFormat, char_format: QTextCharFormat):
        self.doc = document
        self.block_format = block_format
        self.char_format = char_format
        self._ids: dict[str, int] = {}
        self._texts: list[str] = []

    def text(self, code_id: int) -> str:
        """The exact text of a code block (what its Copy link copies)."""
        if not 0 <= code_id < len(self._texts):
            raise KeyError(f"no code block {code_id} in this transcript")
        return self._texts[code_id]

    def decorate(self, markdown: str, start: int) -> None:
        """Replace the code blocks Qt imported from `markdown` (at document position `start`) with
        highlighted exact copies under a Copy header."""
        if "```" not in markdown and "~~~" not in markdown:
            return  # most streaming updates: no fence, no Markdown parse
        blocks = self._runs(start, fences(markdown))
        style = DARK_STYLE if is_dark() else LIGHT_STYLE
        self._quiet = quiet_text().name()
        self._behind = code_background()
        for fence, first, last in reversed(blocks):  # from the end: earlier positions stay valid
            self._replace(fence, first, last, style)

    def _runs(self, start: int, found: list[Fence]) -> list[tuple[Fence, int, int]]:
        """Match each fence to its run of code-tagged blocks: (fence, first block pos, last block pos)."""
        out = []
        block = self.doc.findBlock(start)
        for fence in found:
            if not fence.code:
                continue  # Qt makes no block for an empty fence
            while block.isValid() and not block.blockFormat().hasProperty(_FENCE):
                block = block.next()
            if not block.isValid():
                break  # Qt read the Markdown differently; leave the rest as Qt made it
            first = block
            for _ in range(fence.code.count("\n")):
                nxt = block.next()
                if not nxt.isValid() or not nxt.blockFormat().hasProperty(_FENCE):
                    return out
                block = nxt
            out.append((fence, first.position(), block.position()))
            block = block.next()
        return out

    def _id(self, code: str) -> int:
        if code not in self._ids:
            self._ids[code] = len(self._texts)
            self._texts.append(code)
        return self._ids[code]

    def _replace(self, fence: Fence, first: int, last: int, style: str) -> None:
        c = QTextCursor(self.doc)
        c.setPosition(first)
        c.setPosition(self.doc.findBlock(last).position() + self.doc.findBlock(last).length() - 1,
                      QTextCursor.MoveMode.KeepAnchor)
        c.removeSelectedText()
        header = QTextBlockFormat()
        header.setTopMargin(4)
        c.setBlockFormat(header)
        c.setCharFormat(QTextCharFormat())
        label = f"{html.escape(fence.language)} · " if fence.language else ""
        c.insertHtml(f'<small><span style="color: {self._quiet}">{label}</span>'
                     f'<a href="pd:{COPY_VERB}/{self._id(fence.code)}">Copy</a></small>')
        formats, merged = token_formats(style, self._behind), {}
        c.insertBlock(self.block_format, self.char_format)
        for ttype, value in _tokens(fence.language, fence.code):
            fmt = merged.get(ttype)
            if fmt is None:  # the code font plus the token's colour, once per token type
                fmt = merged[ttype] = QTextCharFormat(self.char_format)
                fmt.merge(_token_format(formats, ttype))
            for i, piece in enumerate(value.split("\n")):
                if i:
                    c.insertBlock(self.block_format, self.char_format)
                if piece:
                    c.insertText(piece, fmt)

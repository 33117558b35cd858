"""Text reads at WCAG AA (4.5:1) in both themes: the palette's text roles, a transcript's meta lines, every
colour of highlighted code against the code block, and the dashboard's labels against its plot background.

The ratio is computed here from the WCAG 2.x formula, independently of the app's own helper."""
from __future__ import annotations

import re

import pytest
from PySide6.QtGui import QColor, QPalette, QTextBlockFormat, QTextCharFormat, QTextDocument, QTextFormat

from app.chat.code_blocks import DARK_STYLE, LIGHT_STYLE, CodeBlocks, token_formats
from app.chat.transcript import CODE_BACKGROUND, Transcript
from app.preferences.theme import dark_palette, light_palette

AA = 4.5
R = QPalette.ColorRole
THEMES = {"light": light_palette, "dark": dark_palette}
# Drawn on the same background by the widgets that show them; disabled text is exempt (WCAG 1.4.3).
ROLE_PAIRS = [(R.WindowText, R.Window), (R.Text, R.Base), (R.Text, R.AlternateBase), (R.ButtonText, R.Button),
              (R.HighlightedText, R.Highlight), (R.PlaceholderText, R.Base), (R.ToolTipText, R.ToolTipBase),
              (R.Link, R.Base), (R.LinkVisited, R.Base)]
CODE = '''@cache
class Node(Base):
    """Doc."""
    def f(self, a: int = 0x1F, *b) -> str:  # comment
        s = f"{a!r}\\n" + 'x' * 2.5e3
        if a is not None and len(b) > 0:
            raise ValueError(r"bad")
        return print(s), True, __name__
'''


def lum(c: QColor) -> float:
    def ch(v: float) -> float:
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
    return 0.2126 * ch(c.redF()) + 0.7152 * ch(c.greenF()) + 0.0722 * ch(c.blueF())


def ratio(a: QColor, b: QColor) -> float:
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def code_background(palette: QPalette) -> QColor:
    """The code block's translucent background as seen over the transcript's Base."""
    base, a = palette.color(R.Base), CODE_BACKGROUND.alphaF()
    return QColor.fromRgbF(*(a * t + (1 - a) * b for t, b in zip(CODE_BACKGROUND.getRgbF()[:3],
                                                                   base.getRgbF()[:3])))


@pytest.fixture(params=list(THEMES))
def palette(request, qapp):
    before = QPalette(qapp.palette())
    p = THEMES[request.param]()
    qapp.setPalette(p)
    yield p
    qapp.setPalette(before)


def test_palette_text_roles_reach_aa(palette):
    low = {f"{fg.name}/{bg.name}": round(ratio(palette.color(fg), palette.color(bg)), 2)
           for fg, bg in ROLE_PAIRS if ratio(palette.color(fg), palette.color(bg)) < AA}
    assert not low


def test_transcript_meta_text_reaches_aa(palette):
    meta = Transcript(QTextDocument())._stats_format().foreground().color()
    assert ratio(meta, palette.color(R.Base)) >= AA


def _rendered_code_colours(doc: QTextDocument) -> set[str]:
    out, block = set(), doc.begin()
    while block.isValid():
        if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
            it = block.begin()
            while not it.atEnd():
                fmt = it.fragment().charFormat()
                if fmt.hasProperty(QTextFormat.Property.ForegroundBrush) and it.fragment().text().strip():
                    out.add(fmt.foreground().color().name())
                it += 1
        block = block.next()
    return out


def test_highlighted_code_reaches_aa_on_the_code_block(palette):
    markdown = f"```python\n{CODE}```\n"
    doc = QTextDocument()
    doc.setMarkdown(markdown)
    block = QTextBlockFormat()
    block.setBackground(CODE_BACKGROUND)
    block.setProperty(QTextFormat.Property.BlockCodeFence, "`")
    CodeBlocks(doc, block, QTextCharFormat()).decorate(markdown, 0)
    colours = _rendered_code_colours(doc)
    assert len(colours) >= 5  # the sample really was highlighted
    behind = code_background(palette)
    assert not {c: round(ratio(QColor(c), behind), 2) for c in colours if ratio(QColor(c), behind) < AA}


def test_every_token_colour_of_the_themes_code_style_reaches_aa(palette):
    """All of the style's token colours, not just those the sample above happens to produce."""
    dark = palette.color(R.Window).lightness() < 128
    behind = code_background(palette)
    formats = token_formats(DARK_STYLE if dark else LIGHT_STYLE, tuple(v * 255 for v in behind.getRgbF()[:3]))
    colours = {f.foreground().color().name() for f in formats.values()
               if f.hasProperty(QTextFormat.Property.ForegroundBrush)}
    assert len(colours) >= 5
    assert not {c: round(ratio(QColor(c), behind), 2) for c in colours if ratio(QColor(c), behind) < AA}


_COLOUR = re.compile(r"color:\s*(#[0-9a-fA-F]{6})")


def test_dashboard_labels_reach_aa_on_its_plot_background(qtbot):
    """The charts keep one dark background in either theme: titles, legend keys, axes and notes on it."""
    from app.panels.dashboard import DashboardDock

    dock = DashboardDock()
    qtbot.addWidget(dock)
    bg = dock.charts.backgroundBrush().color()
    texts: dict[str, QColor] = {}
    for name, plot in dock.plots.items():
        for i, colour in enumerate(_COLOUR.findall(plot.titleLabel.item.toHtml())):  # the title and its keys
            texts[f"{name} title {i}"] = QColor(colour)
        for side in ("left", "bottom"):
            texts[f"{name} {side} axis"] = plot.getAxis(side).textPen().color()
    texts["n/a"] = dock.na_text.textItem.defaultTextColor()
    for name, item in dock.no_source.items():
        texts[f"{name} no source"] = item.textItem.defaultTextColor()
    assert len(texts) > 15
    assert not {k: round(ratio(c, bg), 2) for k, c in texts.items() if ratio(c, bg) < AA}

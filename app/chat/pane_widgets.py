"""Small widgets of the chat views whose size never depends on their text.

A chat pane sits in a 2x2 grid; if a title, banner or error could raise its minimum width, one long title
would widen the whole window. So every variable text is elided to the width it gets,
with the whole text in its tooltip, and running replies are marked by icons, not by longer tab texts.
"""
from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPen, QPixmap
from PySide6.QtWidgets import QLabel, QSizePolicy, QStyle, QToolButton, QWidget

from app.preferences.design_tokens import SPACE

# How the chat list and tabs mark a chat whose reply is under way (state -> (colour, tooltip)).
ACTIVITY = {
    "queued": ("#8a8f99", "queued: waiting for the generator"),
    "deferred": ("#e0a030", "deferred: waiting for a LoRA swap"),
    "prefill": ("#2e9e4f", "generating (reading the prompt)"),
    "streaming": ("#2e9e4f", "generating"),
}


class ElidedLabel(QLabel):
    """One line of text, elided to the label's width; text() is the whole text (also its tooltip).

    It paints the elided line itself instead of handing it to QLabel.setText: QLabel asks its layout again at
    every text change, and a streaming pane changes its state and context meter at every repaint, so each
    token's request climbed ChatPane -> splitter -> ChatArea -> MainWindow and relaid out the whole window.
    Here a new text only repaints the label; the layout is asked only when the size hint changes.
    """

    def __init__(self, text: str = "", parent: QWidget | None = None,
                 mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight):
        super().__init__(parent)
        self._full = ""
        self._compact = ""
        self._shown = ""
        self._mode = mode
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setText(text)

    def setText(self, text: str, compact: str = "") -> None:  # noqa: N802 (Qt naming)
        """Show `text`; where it does not fit, `compact` (a shorter form of it, if given) is drawn instead."""
        full = " ".join(str(text).split())  # one line: newlines would change the height
        if full == self._full and compact == self._compact:
            return
        hint = self.sizeHint()
        self._full, self._compact = full, compact
        self.setToolTip(text if text else "")
        self._elide()
        if self.sizeHint() != hint:
            self.updateGeometry()

    def text(self) -> str:
        return self._full

    def shown(self) -> str:
        """The text as drawn: elided ("…") to the label's width."""
        return self._shown

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        m = self.contentsMargins()
        return QSize(self.fontMetrics().horizontalAdvance("…") * 3 + m.left() + m.right(),
                     self.fontMetrics().height() + m.top() + m.bottom())

    def sizeHint(self) -> QSize:  # noqa: N802
        m = self.contentsMargins()
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + m.left() + m.right() + 2,
                     self.minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        m = self.contentsMargins()
        width = max(0, self.width() - m.left() - m.right() - 2)
        text = self._full
        if self._compact and self.fontMetrics().horizontalAdvance(text) > width:
            text = self._compact
        shown = self.fontMetrics().elidedText(text, self._mode, width)
        if shown != self._shown:
            self._shown = shown
            self.update()

    def paintEvent(self, event) -> None:  # noqa: N802
        super().paintEvent(event)  # the frame and the style sheet's background (QLabel's own text is empty)
        p = QPainter(self)
        self.style().drawItemText(p, self.contentsRect(), int(self.alignment()), self.palette(), self.isEnabled(),
                                  self._shown, self.foregroundRole())
        p.end()


class ColourSwatch(QWidget):
    """A small square in a chat's page-map colour."""

    def __init__(self, rgb: tuple[int, int, int], parent: QWidget | None = None):
        super().__init__(parent)
        self._colour = rgb
        self.setFixedSize(SPACE["md"], SPACE["md"])
        self.setToolTip("this chat's colour on the page map")

    def colour(self) -> tuple[int, int, int]:
        return self._colour

    def paintEvent(self, _event) -> None:  # noqa: N802
        p = QPainter(self)
        p.fillRect(self.rect(), QColor(*self._colour))
        p.end()


# One QIcon per (state, colour), made once: Qt's QPixmapCache keeps each icon's rendered pixmaps under that
# icon's own key until its 10 MB budget evicts them, so an icon drawn afresh at every activity change (a few per
# reply, in the chat list and the tabs) filled that cache with copies of the same squares, ~12 MB of the main
# thread's heap over 1000 changes, and the cache's churn on top.
_ACTIVITY_ICONS: dict[tuple[str, tuple[int, int, int] | None], QIcon] = {}
_MAX_ACTIVITY_ICONS = 256  # states x chat colours; a bound in case colours come from elsewhere


def activity_icon(state: str, rgb: tuple[int, int, int] | None = None) -> QIcon:
    """The chat's colour as a square, with a dot for a running reply (green generating, grey queued, amber
    deferred); an empty icon when idle and no colour is known. The same icon object for the same state and colour."""
    if not state and rgb is None:
        return QIcon()
    key = (state, tuple(rgb) if rgb is not None else None)
    found = _ACTIVITY_ICONS.get(key)
    if found is None:
        if len(_ACTIVITY_ICONS) >= _MAX_ACTIVITY_ICONS:
            _ACTIVITY_ICONS.clear()
        found = _ACTIVITY_ICONS[key] = _draw_activity_icon(state, rgb)
    return found


def _draw_activity_icon(state: str, rgb: tuple[int, int, int] | None) -> QIcon:
    pix = QPixmap(16, 16)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    if rgb is not None:
        p.fillRect(QRectF(1, 1, 8, 8), QColor(*rgb))
    if state:
        colour = QColor(ACTIVITY[state][0])
        p.setPen(QPen(QColor("white"), 1.5))
        p.setBrush(colour)
        p.drawEllipse(QRectF(6, 6, 9, 9))
    p.end()
    return QIcon(pix)


class CompactButtons:
    """A header's buttons: their text when the header has room for it next to a readable title, otherwise
    icons only (the tooltip says what each does), so a squeezed tile never shows "S……" or "Re…te"."""

    TITLE_ROOM = 80  # what the title keeps before the buttons give up their text

    def __init__(self, buttons: list[tuple[QToolButton, QStyle.StandardPixmap]]):
        self.buttons = [b for b, _ in buttons]
        self.compact = False
        self._widths: list[int] = []
        for b, pixmap in buttons:
            b.setIcon(b.style().standardIcon(pixmap))
            if not b.toolTip():
                b.setToolTip(b.text().rstrip("…"))
            b.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)

    def text_width(self) -> int:
        """The buttons' width with their text shown (spacing included), measured while they show it."""
        if not self.compact:
            self._widths = [b.sizeHint().width() + 2 for b in self.buttons]
        return sum(self._widths)

    def fit(self, width: int) -> None:
        """Text or icons for a header `width` px wide (its other fixed parts already taken off)."""
        compact = width - self.TITLE_ROOM < self.text_width()
        if compact != self.compact:
            self.compact = compact
            style = Qt.ToolButtonStyle.ToolButtonIconOnly if compact else Qt.ToolButtonStyle.ToolButtonTextOnly
            for b in self.buttons:
                b.setToolButtonStyle(style)

"""The dashboard's expert map for a mixture-of-experts model: a layers x experts heat map of how many rows each
expert took over the generator's last steps, one chat's routing while its pane is hovered (or has the focus),
and the expert bytes a token reads against a dense model of the same size.

It draws metrics()' `experts` (engine.generator.expert_stats: plain numpy arrays and dicts); a dense model or
a remote server sends None and the map hides. The heat runs from the theme's chip colour (no rows) to its
accent (design_tokens: both themes read); a chat's routing runs to the chat's own colour (app.core.chat_colours,
its pane's swatch) over the other chats' rows, drawn faint. The cells are one image scaled to the widget: a
model of 48 layers and 128 experts paints as fast as a tiny one.

Which chat: the pane under the mouse pointer, else the pane that has the keyboard focus; a widget belongs to a
chat pane when an ancestor has a `session` with a `chat_id` (the panels never import the chat views).
Replies of one chat (its N replies, identifiers (chat_id, i)) count together.
"""
from __future__ import annotations

from typing import Hashable, Mapping

import numpy as np
from PySide6.QtCore import QEvent, QPoint, QRect, QSize, Qt
from PySide6.QtGui import QColor, QCursor, QImage, QLinearGradient, QPainter, QPen
from PySide6.QtWidgets import QApplication, QHBoxLayout, QSizePolicy, QToolTip, QVBoxLayout, QWidget

from app.core.chat_colours import CHAT_COLOURS
from app.core.formatting import human_bytes, human_count
from app.panels.wrap_label import WrapLabel
from app.preferences.design_tokens import SPACE, roles
from app.preferences.theme import is_dark

FAINT = 0.3  # how far the other chats' rows go towards the quiet colour behind a chat's own


def chat_of(identifier: Hashable) -> Hashable:
    """The chat a job's identifier belongs to: a chat id (int, or its text), or the first part of an extra
    reply's (chat_id, i)."""
    if isinstance(identifier, tuple) and identifier:
        identifier = identifier[0]
    text = str(identifier)
    return int(text) if text.isdigit() else identifier


def chat_pane_of(widget: QWidget | None) -> Hashable | None:
    """The chat id of the chat pane `widget` is in (None: not in one)."""
    while widget is not None:
        session = getattr(widget, "session", None)
        chat_id = getattr(session, "chat_id", None)
        if chat_id is not None:
            return chat_id
        widget = widget.parentWidget()
    return None


def _heat(values: np.ndarray, low: tuple, high: tuple) -> np.ndarray:
    """RGB (rows, cols, 3) uint8 from values in 0..1, linear from `low` to `high`."""
    lo, hi = np.array(low, np.float32), np.array(high, np.float32)
    return (lo + values[..., None].astype(np.float32) * (hi - lo)).round().astype(np.uint8)


class ExpertGrid(QWidget):
    """The cells: one row per sparse layer, one column per expert; the tooltip names a cell's counts."""

    def __init__(self, owner: "ExpertMap") -> None:
        super().__init__()
        self.owner = owner
        self.setMouseTracking(True)
        self.setMinimumHeight(60)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Expanding)
        self._image: QImage | None = None
        self._rgb: np.ndarray | None = None  # the image's pixels (QImage does not copy them)

    def sizeHint(self) -> QSize:
        return QSize(240, self.minimumHeight())

    def set_rgb(self, rgb: np.ndarray | None) -> None:
        if rgb is not None:  # rows of 10 px up to 12 layers, then squeezed into 120 px (and at least 60)
            self.setMinimumHeight(max(60, min(10 * rgb.shape[0], 120)) + self.fontMetrics().height())
        self._rgb = None if rgb is None else np.ascontiguousarray(rgb)
        self._image = None if rgb is None else QImage(self._rgb.data, rgb.shape[1], rgb.shape[0], rgb.shape[1] * 3,
                                                      QImage.Format.Format_RGB888)
        self.update()

    def cells(self) -> QRect:
        """Where the cells are drawn (the widget less the axis labels' margins)."""
        fm = self.fontMetrics()
        return self.rect().adjusted(fm.horizontalAdvance("L00") + SPACE["xs"], 0, 0, -fm.height())

    def cell_at(self, pos: QPoint) -> tuple[int, int] | None:
        """(row, expert) under a point of the widget, or None."""
        counts, area = self.owner.counts, self.cells()
        if counts is None or not area.contains(pos) or not counts.size:
            return None
        row = (pos.y() - area.top()) * counts.shape[0] // max(area.height(), 1)
        col = (pos.x() - area.left()) * counts.shape[1] // max(area.width(), 1)
        return min(row, counts.shape[0] - 1), min(col, counts.shape[1] - 1)

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        c = roles(is_dark(self.palette()))
        area = self.cells()
        if self._image is not None:
            p.drawImage(area, self._image)
            layers, experts = self.owner.counts.shape
            if area.width() >= 4 * experts and area.height() >= 4 * layers:  # hairlines where cells are big
                p.setPen(QPen(QColor(*c.chip_border), 1))
                for i in range(1, experts):
                    x = area.left() + i * area.width() // experts
                    p.drawLine(x, area.top(), x, area.bottom())
                for j in range(1, layers):
                    y = area.top() + j * area.height() // layers
                    p.drawLine(area.left(), y, area.right(), y)
        p.setPen(self.palette().color(self.foregroundRole()))
        fm = self.fontMetrics()
        layer_ids = self.owner.layer_ids
        if layer_ids:  # the first and last sparse layer's model index, and the expert range under the cells
            p.drawText(QRect(0, area.top(), area.left() - SPACE["xxs"], fm.height()),
                       Qt.AlignmentFlag.AlignRight, f"L{layer_ids[0]}")
            p.drawText(QRect(0, area.bottom() - fm.height(), area.left() - SPACE["xxs"], fm.height()),
                       Qt.AlignmentFlag.AlignRight, f"L{layer_ids[-1]}")
            experts = self.owner.counts.shape[1]
            below = QRect(area.left(), area.bottom() + 1, area.width(), fm.height())
            p.drawText(below, Qt.AlignmentFlag.AlignLeft, "expert 0")
            p.drawText(below, Qt.AlignmentFlag.AlignRight, str(experts - 1))
        p.end()

    def mouseMoveEvent(self, event) -> None:
        cell = self.cell_at(event.position().toPoint())
        if cell is not None:
            QToolTip.showText(event.globalPosition().toPoint(), self.owner.describe_cell(*cell), self)
        else:
            QToolTip.hideText()


class HeatLegend(QWidget):
    """The colour scale: 0 to the busiest cell's rows, in the colours the cells use now."""

    def __init__(self) -> None:
        super().__init__()
        self.low, self.high, self.top = (0, 0, 0), (0, 0, 0), 0
        self.setFixedHeight(self.fontMetrics().height() + SPACE["xs"])
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)

    def set_scale(self, low: tuple, high: tuple, top: int) -> None:
        if (low, high, top) != (self.low, self.high, self.top):
            self.low, self.high, self.top = low, high, top
            self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        fm = self.fontMetrics()
        left, right = "0 rows", f"{human_count(self.top)} rows"
        bar = self.rect().adjusted(fm.horizontalAdvance(left) + SPACE["sm"], SPACE["xxs"],
                                   -fm.horizontalAdvance(right) - SPACE["sm"], -SPACE["xxs"])
        gradient = QLinearGradient(bar.left(), 0, bar.right(), 0)
        gradient.setColorAt(0, QColor(*self.low))
        gradient.setColorAt(1, QColor(*self.high))
        p.fillRect(bar, gradient)
        p.setPen(self.palette().color(self.foregroundRole()))
        p.drawText(self.rect(), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, left)
        p.drawText(self.rect(), Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, right)
        p.end()


class ExpertMap(QWidget):
    """Title line, the grid, its legend and the bytes line; push() takes metrics()' `experts`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Expert map")
        self.counts: np.ndarray | None = None  # (sparse layers, experts) of what the grid shows
        self.all_counts: np.ndarray | None = None  # every chat's
        self.layer_ids: list[int] = []
        self.experts: Mapping | None = None
        self.chat: Hashable | None = None  # the chat whose routing is shown (None: all chats)
        self.chat_how = ""  # "hovered" or "focused"
        self._drawn: tuple | None = None  # what the grid shows now: skip redraws that change nothing
        self.title = WrapLabel()
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        self.grid = ExpertGrid(self)
        self.grid.setAccessibleName("Expert map cells")
        self.legend = HeatLegend()
        self.legend.setAccessibleName("Expert map colour scale")
        self.bytes_label = WrapLabel()
        self.bytes_label.setTextFormat(Qt.TextFormat.PlainText)
        self.bytes_label.setAccessibleName("Expert bytes read per token")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(SPACE["xs"], SPACE["xxs"], SPACE["xs"], SPACE["xxs"])
        layout.setSpacing(SPACE["xxs"])
        layout.addWidget(self.title)
        layout.addWidget(self.grid, 1)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.legend, 1)
        layout.addLayout(row)
        layout.addWidget(self.bytes_label)
        app = QApplication.instance()
        if app is not None:
            app.focusChanged.connect(self._focus_changed)
        self.hide()

    # ---------------------------------------------------------------------------------- feeding
    def push(self, experts: Mapping | None) -> None:
        """Take a snapshot's `experts` (None: not a mixture-of-experts model: the map hides)."""
        self.setVisible(experts is not None)
        self.experts = experts
        if experts is None:
            self.counts = self.all_counts = None
            self._drawn = None
            return
        self.follow(*self._chat_now())
        self._redraw()

    def clear(self) -> None:
        self.push(None)

    def follow(self, chat: Hashable | None, how: str = "") -> None:
        """Show `chat`'s routing ("hovered" or "focused" says why), or every chat's (None)."""
        if (chat, how) != (self.chat, self.chat_how):
            self.chat, self.chat_how = chat, how
            self._redraw()

    def _chat_now(self) -> tuple[Hashable | None, str]:
        """The chat pane under the pointer, else the focused one; (None, "") when neither is a chat pane."""
        hovered = chat_pane_of(QApplication.widgetAt(QCursor.pos()))
        if hovered is not None:
            return hovered, "hovered"
        focused = chat_pane_of(QApplication.focusWidget())
        return (focused, "focused") if focused is not None else (None, "")

    def _focus_changed(self, _old, _new) -> None:
        if self.experts is not None:
            self.follow(*self._chat_now())

    def chat_counts(self, chat: Hashable) -> np.ndarray | None:
        """(layers, experts) rows of every job of `chat` still in the window; None: it has none."""
        e = self.experts
        mine = [counts for serial, counts in e["jobs"].items() if chat_of(e["identifiers"].get(serial)) == chat]
        return sum(mine[1:], np.asarray(mine[0])) if mine else None

    def _redraw(self) -> None:
        e = self.experts
        if e is None:
            return
        dark = is_dark(self.palette())
        key = (e["steps_total"], self.chat, dark, CHAT_COLOURS.colour(self.chat) if self.chat is not None else None)
        if key == self._drawn:
            return
        self._drawn = key
        c = roles(dark)
        self.layer_ids = list(e["layers"])
        self.all_counts = np.asarray(e["counts"])
        mine = self.chat_counts(self.chat) if self.chat is not None else None
        title = CHAT_COLOURS.label(self.chat) if self.chat is not None else None
        name = f"“{title}”" if title else f"chat {self.chat}"
        window = f"last {e['steps']} steps" if e["steps"] < e["window"] else f"last {e['window']} steps"
        if mine is None:
            self.counts = self.all_counts
            top = int(self.counts.max()) if self.counts.size else 0
            high = c.role_label
            rgb = _heat(self.counts / max(top, 1), c.chip, high)
            who = "all chats" + (f" ({name}, {self.chat_how}, has no rows in this window)" if self.chat is not None else "")
        else:
            self.counts = mine
            top = int(mine.max())
            high = CHAT_COLOURS.colour(self.chat) or c.role_label
            behind = _heat(self.all_counts / max(int(self.all_counts.max()), 1) * FAINT, c.chip, c.chip_border)
            rgb = np.where((mine > 0)[..., None], _heat(mine / max(top, 1), c.chip, high), behind)
            who = f"{name} ({self.chat_how} pane)"
        self.grid.set_rgb(rgb)
        self.legend.set_scale(c.chip, high, top)
        layers, experts = self.all_counts.shape
        self.title.setText(f"Expert map, {window}: rows per expert, {who} · {layers} layers × {experts} experts, "
                           f"top {e['top_k']} a row")
        read, one, dense = e["read_bytes_per_token"], e["top_k_bytes_per_token"], e["dense_bytes_per_token"]
        measured = "–" if read is None else f"{human_bytes(read)} ({100 * read / dense:.0f} %)"
        self.bytes_label.setText(f"Expert weights read per token: {measured} in this window's batches · "
                                 f"one token alone {human_bytes(one)} ({100 * one / dense:.0f} %) · a dense model "
                                 f"of this size {human_bytes(dense)}")
        busiest = np.unravel_index(int(np.argmax(self.counts)), self.counts.shape) if top else None
        self.setAccessibleDescription(
            f"Heat map of {layers} sparse layers by {experts} experts: rows each expert took over the {window}, "
            f"{who}." + (f" Busiest: layer {self.layer_ids[busiest[0]]}, expert {busiest[1]}, {top} rows."
                         if busiest is not None else " No rows yet."))

    def describe_cell(self, row: int, expert: int) -> str:
        """A cell's tooltip: its layer and expert, every chat's rows and the shown chat's."""
        text = f"layer {self.layer_ids[row]} · expert {expert}: {int(self.all_counts[row, expert])} rows (all chats)"
        if self.counts is not self.all_counts:
            text += f", {int(self.counts[row, expert])} of this chat's"
        return text

    def changeEvent(self, event) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._drawn = None  # the theme changed: recolour
            self._redraw()
        super().changeEvent(event)

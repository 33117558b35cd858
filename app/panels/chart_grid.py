"""The dashboard's charts: pyqtgraph plots in one view that reflow to its width and never clip.

A plot title carries its colour keys ("jobs: ▬ batch ▬ pending ▬ deferred"), which is wider than a narrow
dock: the title wraps onto a second line instead of widening the plot past the view (where pyqtgraph would
cut it off, it draws no scroll bars). The plots stack in one column, or fill two columns row by row when the view is
wide enough (an odd last plot spans the row); the time axis is shown once, under the last plot.
Text sizes follow the application's font, so a desktop at 200 % gets titles and ticks to match, with the
value axis wide enough for its labels and the view tall enough for every plot at that size.
"""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication, QWidget

PLOT_BODY_EM = 4.0  # the least height of a plot's curve area, in lines of text: below it curves are unreadable
COLUMN_EM = 32.0  # a column's plot area is at least this many average characters wide for two columns
TITLE_SCALE = 0.9  # titles a touch smaller than body text, as pyqtgraph's own


class ChartGrid(pg.GraphicsLayoutWidget):
    """PlotItems in one column, or two when wide, sharing one time axis; `add_plot` adds one with a title."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plots: list[pg.PlotItem] = []
        self.columns = 1
        self.bottom_label = ""
        self.ci.layout.setVerticalSpacing(2)
        self.ci.layout.setHorizontalSpacing(6)
        self._title_width: dict[int, float] = {}  # id(plot) -> the width its title wrapped to (-1: one line)

    # ---------------------------------------------------------------------------------- building
    def add_plot(self, title: str) -> pg.PlotItem:
        plot = pg.PlotItem()
        plot.setTitle(title, size=self._title_size())
        plot.setLabel("bottom", self.bottom_label)
        self.plots.append(plot)
        self.ci.addItem(plot, row=len(self.plots) - 1, col=0)
        self._place(self.columns, force=True)
        return plot

    def set_bottom_label(self, text: str) -> None:
        """The time axis' name, shown under the last plot of each column."""
        self.bottom_label = text
        for plot in self.plots:
            plot.setLabel("bottom", text)
        self._place(self.columns, force=True)

    @staticmethod
    def _title_size() -> str:
        return f"{QApplication.font().pointSizeF() * TITLE_SCALE:.1f}pt"

    # ---------------------------------------------------------------------------------- layout
    def column_count(self, width: int) -> int:
        """Two columns when the view fits two of COLUMN_EM characters, else one."""
        least = COLUMN_EM * QFontMetrics(self.font()).averageCharWidth() + self._axis_width()
        return 2 if len(self.plots) > 2 and width >= 2 * least + self.ci.layout.horizontalSpacing() + 20 else 1

    def _axis_width(self) -> float:
        return max((p.getAxis("left").width() for p in self.plots if p.getAxis("left").isVisible()), default=0)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt naming; pyqtgraph calls it with None too)
        if getattr(self, "plots", None):
            self._place(self.column_count(self.width()))
        super().resizeEvent(event)

    def _place(self, columns: int, force: bool = False) -> None:
        """Lay the plots out in `columns` columns (filled top to bottom), wrap their titles to the column."""
        if columns != self.columns or force:
            self.columns = columns
            for plot in self.plots:
                if plot in self.ci.items:
                    self.ci.removeItem(plot)
            for i, plot in enumerate(self.plots):  # row by row; an odd last plot spans the row
                row, col = divmod(i, columns)
                last = i == len(self.plots) - 1
                self.ci.addItem(plot, row=row, col=col, colspan=columns - col if last else 1)
                plot.showAxis("bottom", last)  # one time axis for all: every plot shows the same window
        self._fit_titles()

    def _fit_titles(self) -> None:
        """Each title on one line when it fits its column, wrapped to the column's width when not; the
        title row as tall as its lines, the view's least height enough for every row."""
        width = self.viewport().width() if self.isVisible() else self.width()
        spacing = self.ci.layout.horizontalSpacing()
        left, _, right, _ = self.ci.layout.getContentsMargins()
        column = (width - left - right - 2 - (self.columns - 1) * spacing) / self.columns
        tallest_title = 0.0
        for i, plot in enumerate(self.plots):
            label = plot.titleLabel
            label.item.setTextWidth(-1)
            whole = label.item.boundingRect().width()
            span = self.columns - i % self.columns if i == len(self.plots) - 1 else 1
            room = max(40.0, span * column + (span - 1) * spacing - plot.getAxis("left").width() - 6)
            wrap = room if whole > room else -1.0
            label.item.setTextWidth(wrap)
            height = label.item.boundingRect().height()
            label.setMaximumHeight(height)
            plot.layout.setRowFixedHeight(0, height)
            label.updateMin()
            label.resizeEvent(None)
            tallest_title = max(tallest_title, height)
            self._title_width[id(plot)] = wrap
        if self.plots:
            metrics = QFontMetrics(self.font())
            rows = -(-len(self.plots) // self.columns)
            body = PLOT_BODY_EM * metrics.height()
            axis = 2.6 * metrics.height()  # the time axis' ticks and name under the column's last plot
            self.setMinimumHeight(int(rows * (tallest_title + body) + axis + 8))
        self.ci.layout.activate()  # the narrower minimum now, before the view sizes the plots to itself

    def showEvent(self, event) -> None:  # noqa: N802
        """Hidden (a tabbed dock behind another), the view had no width to wrap to: fit it now."""
        super().showEvent(event)
        self._place(self.column_count(self.width()))
        self.resizeEvent(None)

    def title_fits(self, plot: pg.PlotItem) -> bool:
        """True when the plot's title lies within the plot (wrapped or not): what a test can check."""
        label = plot.titleLabel
        return label.item.mapRectToScene(label.item.boundingRect()).width() <= plot.sceneBoundingRect().width() + 0.5


def axis_width(font_metrics: QFontMetrics, widest: str = "0000") -> int:
    """The value axis' width: its widest tick label, the tick and a gap, at the current font."""
    return font_metrics.horizontalAdvance(widest) + font_metrics.height() // 2 + 8

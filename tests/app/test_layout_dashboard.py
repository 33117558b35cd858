"""The dashboard lays out without clipping at every dock width a 1280x720 or 1366x768 screen gives it
(a user-narrowed 200 px included) and reflows when wide: every plot inside the charts' view, every plot
title inside its plot (wrapped, its colour keys kept), every wrapped label given all its lines."""
import pytest
from PySide6.QtWidgets import QApplication, QLabel

from app.panels.dashboard import DashboardDock
from tests.app.test_dashboard import STATES, dock, snapshot  # noqa: F401 (dock: a fixture)


@pytest.fixture
def fed(dock):  # noqa: F811 (the dashboard's own fixture, fed)
    for i in range(3):  # real text in every label, a page map to lay out
        dock.push(snapshot(STATES, 1.0 + i, tokens=40 * i, drafted=10 * i, accepted=6 * i,
                           accepted_per_position=[6, 4, 2], experts=None))
    return dock


def settle():
    for _ in range(6):
        QApplication.processEvents()


def clipped(d: DashboardDock) -> dict:
    """What the dock cuts off now: plots past the charts' view, titles past their plot, wrapped labels
    shorter than their lines."""
    charts = d.charts
    view = charts.viewport().width()
    out = {}
    for name, plot in d.plots.items():
        rect = charts.mapFromScene(plot.sceneBoundingRect()).boundingRect()
        if rect.right() > view or rect.left() < 0:
            out[f"{name} plot"] = (rect.left(), rect.right(), view)
        title = plot.titleLabel.item
        shown = title.mapRectToScene(title.boundingRect())
        if shown.right() > plot.sceneBoundingRect().right() + 0.5 or shown.left() < plot.sceneBoundingRect().left() - 0.5:
            out[f"{name} title"] = (shown.left(), shown.right(), plot.sceneBoundingRect().right())
    for label in d.findChildren(QLabel):
        if label.isVisible() and label.wordWrap() and label.text():
            if label.height() < label.heightForWidth(label.width()):
                out[f"label {label.text()[:30]!r}"] = (label.width(), label.height(), label.heightForWidth(label.width()))
            if label.width() > label.parentWidget().width():
                out[f"label {label.text()[:30]!r} width"] = (label.width(), label.parentWidget().width())
    return out


@pytest.mark.parametrize("width", [200, 260, 330, 360])  # a narrowed dock, 1280x720's and 1366x768's first-start width
def test_nothing_is_clipped_at_a_small_screens_dock_widths(fed, width):
    dock = fed
    dock.resize(width, 700)
    settle()
    assert clipped(dock) == {}
    assert dock.charts.columns == 1
    assert "in use" in dock.plots["occupancy"].titleLabel.item.toPlainText()  # the keys kept, wrapped


def test_wide_dock_shows_the_plots_in_two_columns_and_back(fed):
    dock = fed
    dock.resize(760, 700)
    settle()
    assert clipped(dock) == {}
    rows = sorted({round(p.sceneBoundingRect().top()) for p in dock.plots.values()})
    assert len(rows) == 3 and dock.charts.columns == 2  # five plots: two rows of two, the last one across
    assert dock.plots["sampling"].getAxis("bottom").isVisible()  # one time axis, under the last plot
    assert not dock.plots["occupancy"].getAxis("bottom").isVisible()
    dock.resize(300, 700)
    settle()
    assert dock.charts.columns == 1 and clipped(dock) == {}


def test_y_axes_start_with_a_few_ticks(qtbot):
    """Before any sample the fitted plots read 0..floor with 2-3 ticks, not pyqtgraph's crowd on 0..1."""
    fresh = DashboardDock()
    qtbot.addWidget(fresh)
    for name in ("jobs", "tokens", "sampling"):
        lo, hi = fresh.plots[name].viewRange()[1]
        assert lo == pytest.approx(0, abs=0.01) and hi >= 1.0
        assert fresh.plots[name].getAxis("left")._tickSpacing is not None

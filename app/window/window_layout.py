"""How the main window fits a screen: its size on the screen's available area, scrollable panels, the tiles.

A 1280x720 screen must show the whole window: panels scroll instead of raising the window's
minimum size, the chat area has a fixed minimum instead of the sum of its panes', and a tile narrower than
its pane squeezes the pane rather than collapsing it. Tiles side by side share their row equally and each
keeps TILE_MINIMUM's width (a message box a sentence wide): the chat area asks that much of the window,
whose side docks give it up first (tiles_width).
"""
from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtWidgets import QDockWidget, QFrame, QMainWindow, QScrollArea, QSplitter, QWidget

from app.panels.wheel_guard import guard_wheel

PREFERRED_SIZE = QSize(1400, 900)  # first start, shrunk to the screen's available area
CENTRAL_MINIMUM = QSize(360, 320)  # the chat area's minimum, whatever its panes would like
TILE_MINIMUM = QSize(250, 150)  # a tile squeezes its pane down to this (the pane's own minimum can be wider)
SPLITTER_HANDLE = 5  # the tiles' dividers, px


def fit_window(window: QMainWindow, available: QRect, restored: bool, side_docks: list[QDockWidget]) -> None:
    """Size the window to PREFERRED_SIZE or the available screen area, whichever is smaller (a restored
    geometry too), frame included, and keep it on that area. A first start centres it and gives the side
    docks (chat list, dashboard) a share of the width."""
    frame = window.frameGeometry().size() - window.geometry().size()  # title bar and borders (none offscreen)
    room = available.size() - frame
    current = window.size() if restored else PREFERRED_SIZE
    size = current.boundedTo(room).expandedTo(window.minimumSizeHint().boundedTo(room))
    window.resize(size)
    x = min(max(window.x(), available.left()), available.right() + 1 - size.width() - frame.width())
    y = min(max(window.y(), available.top()), available.bottom() + 1 - size.height() - frame.height())
    if not restored:
        window.resizeDocks(side_docks, [size.width() * 15 // 100, size.width() * 26 // 100][: len(side_docks)],
                         Qt.Orientation.Horizontal)
        x = available.left() + (available.width() - size.width() - frame.width()) // 2
        y = available.top() + (available.height() - size.height() - frame.height()) // 2
    window.move(x, y)


def scrolled(widget: QWidget) -> QScrollArea:
    """The widget in a frameless scroll area: it can shrink below its minimum size without clipping. Its value
    widgets pass the wheel to the area until focused (app.panels.wheel_guard)."""
    guard_wheel(widget)
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setWidget(widget)
    return area


def columns(tiles: int) -> int:
    """How many panes side by side `tiles` tiles make: 1-3 in a row, 4 as 2x2."""
    return 2 if tiles == 4 else max(1, tiles)


def tiles_width(tiles: int) -> int:
    """The width `tiles` tiles need so that every pane keeps TILE_MINIMUM's width."""
    n = columns(tiles)
    return n * TILE_MINIMUM.width() + (n - 1) * SPLITTER_HANDLE


def grid(panes: list[QWidget]) -> QSplitter:
    """1-3 panes side by side; 4 as a 2x2 grid of splitters (every divider draggable), sharing the room
    equally. A pane is squeezed to fit its tile (its text wraps; its header may clip) and never collapses
    to nothing."""
    if len(panes) == 4:
        outer = _splitter(Qt.Orientation.Vertical)
        for pair in (panes[:2], panes[2:]):
            outer.addWidget(grid(pair))
        _equal(outer)
        return outer
    row = _splitter(Qt.Orientation.Horizontal)
    for p in panes:
        p.setMinimumSize(TILE_MINIMUM)  # an explicit minimum overrides the one the pane's contents ask for
        row.addWidget(p)
    _equal(row)
    return row


def _splitter(orientation: Qt.Orientation) -> QSplitter:
    split = QSplitter(orientation)
    split.setChildrenCollapsible(False)
    split.setHandleWidth(SPLITTER_HANDLE)
    return split


def _equal(split: QSplitter) -> None:
    """Equal shares, now and as the splitter grows or shrinks (not the panes' size hints, which differ
    with their titles and buttons)."""
    for i in range(split.count()):
        split.setStretchFactor(i, 1)
    split.setSizes([1000] * split.count())

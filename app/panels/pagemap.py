"""The page-table map: one cell per cache page, drawn as a single RGBA image.

Thousands of pages must repaint ten times a second without slowing generation, so the map is one
numpy buffer blitted through one pyqtgraph ImageItem (never one graphics item per page). Each page is
a `cell` x `cell` pixel square (the last row/column is the gap between cells); shared prefix pages get
a diagonal white hatch over their owner's colour; pages a preempted reply left in the prompt cache (it
resumes from them unless another job takes them first) are drawn hollow, a frame in its colour around the
cached grey. A job's colour is its identifier's (a chat's) in
app.core.chat_colours, the swatch its chat pane shows; a job without an identifier is coloured by serial.
"Colour by adapter" paints each page by the LoRA set
its K/V was computed under (cached pages too), so chats on different adapters show apart.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtGui import QCursor
from PySide6.QtWidgets import QCheckBox, QToolTip, QVBoxLayout, QWidget

from app.core.chat_colours import CHAT_COLOURS, PALETTE
from app.core.formatting import adapters_text
from app.panels.preemption_table import PreemptionTable
from app.panels.wrap_label import WrapLabel
from engine.contract import CACHED as CACHED_STATE
from engine.contract import FREE as FREE_STATE

BACKGROUND = (18, 19, 23, 255)
FREE_COLOUR = (52, 55, 62, 255)
CACHED_COLOUR = (128, 134, 150, 255)
HATCH_COLOUR = (255, 255, 255, 255)
JOB_PALETTE = PALETTE


def job_colour(serial: int) -> tuple[int, int, int, int]:
    """Stable colour of a job: the same serial always gets the same colour between frames."""
    r, g, b = JOB_PALETTE[serial % len(JOB_PALETTE)]
    return (r, g, b, 255)


def cell_size_for(pages: int) -> int:
    """Bigger cells when there are few pages, so the hatch stays readable; small ones for 16k pages."""
    if pages <= 1024:
        return 8
    if pages <= 4096:
        return 6
    return 4


def columns_for(pages: int, aspect: float) -> int:
    """Columns that make a `pages`-cell grid about `aspect` (width / height) wide."""
    return max(1, min(pages, math.ceil(math.sqrt(max(pages, 1) * max(aspect, 0.05)))))


_LUT = np.array([FREE_COLOUR, CACHED_COLOUR] + [job_colour(i) for i in range(len(JOB_PALETTE))], np.uint8)


class PageImage:
    """Renders page states into a preallocated RGBA buffer that only reallocates when the grid changes."""

    def __init__(self) -> None:
        self.pages = 0
        self.cols = 1
        self.rows = 0
        self.cell = 8
        self.rgba = np.zeros((0, 0, 4), np.uint8)
        self._states = np.zeros(0, np.int64)
        self._shared = np.zeros(0, bool)
        self._incoming = np.zeros(0, np.int64)
        self._incoming_shared = np.zeros(0, bool)
        self._preempted: dict[int, int] = {}  # page -> serial of the preempted job whose K/V it caches
        self._dirty = True
        self._index = np.zeros(0, np.int64)
        self._colours = np.zeros((0, 4), np.uint8)
        self._slots: dict[int, int] = {}  # job serial -> palette slot (its identifier's); others: serial % n

    def set_slots(self, slots: dict[int, int]) -> None:
        """Palette slots of the jobs whose identifier has a colour; a change repaints the next load()."""
        if slots != self._slots:
            self._slots = dict(slots)
            self._dirty = True

    def set_preempted(self, pages: Mapping[int, int] | None) -> None:
        """Cached pages still holding a preempted job's K/V (page -> its serial); drawn hollow in its colour."""
        pages = {int(k): int(v) for k, v in (pages or {}).items() if 0 <= int(k) < self.pages}
        if pages != self._preempted:
            self._preempted = pages
            self._dirty = True

    @property
    def preempted(self) -> dict[int, int]:
        return self._preempted

    def slot_of(self, serial: int) -> int:
        return self._slots.get(serial, serial % len(JOB_PALETTE))

    def layout(self, pages: int, cols: int) -> bool:
        """Size the buffers for `pages` in `cols` columns; returns True when they were reallocated."""
        cell = cell_size_for(pages)
        cols = max(1, min(cols, max(pages, 1)))
        rows = math.ceil(pages / cols) if pages else 0
        if (pages, cols, rows, cell) == (self.pages, self.cols, self.rows, self.cell):
            return False
        self.pages, self.cols, self.rows, self.cell = pages, cols, rows, cell
        self.rgba = np.zeros((rows * cell, cols * cell, 4), np.uint8)
        self._states = np.full(pages, FREE_STATE, np.int64)
        self._shared = np.zeros(pages, bool)
        self._incoming = np.zeros(pages, np.int64)
        self._incoming_shared = np.zeros(pages, bool)
        self._preempted = {}
        self._dirty = True
        self._index = np.zeros(rows * cols, np.int64)
        self._colours = np.zeros((rows * cols, 4), np.uint8)
        return True

    @property
    def states(self) -> np.ndarray:
        return self._states

    @property
    def shared(self) -> np.ndarray:
        return self._shared

    def load(self, states: Sequence[int], shared: Sequence[bool] | None) -> bool:
        """Copy one snapshot's page states in place (no buffer growth); True when the map changed.

        Most 100 ms snapshots change no page (a job needs a new page only every page_size tokens), so
        the caller skips re-rendering and re-uploading the image for them.
        """
        if len(states) != self.pages:
            raise ValueError(f"page_states has {len(states)} entries, expected pages_total={self.pages}")
        incoming, incoming_shared = self._incoming, self._incoming_shared
        incoming[:] = states
        if self.pages and int(incoming.min()) < FREE_STATE:
            raise ValueError(f"page_states holds {int(incoming.min())}; valid are serial >= 0, -1 cached, -2 free")
        if shared is None:
            incoming_shared[:] = False
        else:
            if len(shared) != self.pages:
                raise ValueError(f"page_shared has {len(shared)} entries, expected pages_total={self.pages}")
            incoming_shared[:] = shared
        changed = self._dirty or not (np.array_equal(incoming, self._states)
                                      and np.array_equal(incoming_shared, self._shared))
        if changed:
            self._states[:] = incoming
            self._shared[:] = incoming_shared
            self._dirty = False
        return changed

    def render(self) -> np.ndarray:
        """Paint the current states into `rgba` and return it."""
        n, cell = self.pages, self.cell
        if not n:
            return self.rgba
        index = self._index
        index[n:] = -1  # padding cells after the last page
        states = self._states
        np.remainder(states, len(JOB_PALETTE), out=index[:n])
        for serial, slot in self._slots.items():
            index[:n][states == serial] = slot
        index[:n] += 2
        idle = states < 0
        index[:n][idle] = states[idle] + 2  # -2 free -> 0, -1 cached -> 1
        hollow = [(page, serial) for page, serial in self._preempted.items() if states[page] == CACHED_STATE]
        for page, serial in hollow:
            index[page] = self.slot_of(serial) + 2
        colours = self._colours
        np.take(_LUT, index, axis=0, out=colours, mode="clip")
        colours[index < 0] = BACKGROUND
        grid = self.rgba.reshape(self.rows, cell, self.cols, cell, 4)
        grid[...] = colours.reshape(self.rows, 1, self.cols, 1, 4)
        grid[:, cell - 1] = BACKGROUND
        grid[:, :, :, cell - 1] = BACKGROUND
        if hollow and cell > 3:  # the frame in the job's colour, the inside cached grey
            rows, cols = np.divmod(np.array([page for page, _ in hollow]), self.cols)
            grid[rows, 1 : cell - 2, cols, 1 : cell - 2] = CACHED_COLOUR
        shared_pages = np.flatnonzero(self._shared)
        if shared_pages.size:
            rows, cols = np.divmod(shared_pages, self.cols)
            for i in range(cell - 1):
                for j in range(cell - 1):
                    if (i + j) % 3 == 0:
                        grid[rows, i, cols, j] = HATCH_COLOUR
        return self.rgba

    def page_at(self, x: float, y: float) -> int | None:
        """Page index under image pixel coordinates (x right, y down), or None outside the grid."""
        if x < 0 or y < 0:
            return None
        col, row = int(x // self.cell), int(y // self.cell)
        if col >= self.cols or row >= self.rows:
            return None
        index = row * self.cols + col
        return index if index < self.pages else None

    def cell_origin(self, page: int) -> tuple[int, int]:
        """Top-left image pixel (x, y) of a page's cell."""
        row, col = divmod(page, self.cols)
        return col * self.cell, row * self.cell


class PageMapWidget(QWidget):
    """Interactive page map: the image, a legend, and a hover line naming the page's chat."""

    page_hovered = Signal(int)

    def __init__(self, parent: QWidget | None = None, aspect: float = 2.0) -> None:
        super().__init__(parent)
        self.pages = PageImage()
        self._aspect = aspect
        self._owners: dict[int, object] = {}
        self._held: set = set()  # identifiers this map holds a colour for (released when they leave)
        self._labels: dict[object, str] = {}
        self._job_states = np.zeros(0, np.int64)  # the snapshot's page_states (what hover describes)
        self._page_adapters: np.ndarray | None = None
        self._adapter_sets: dict[int, list] = {}
        self._last: tuple | None = None
        self._hovered: int | None = None
        self.view = pg.GraphicsLayoutWidget()
        self.view.setAccessibleName("Page map of the KV cache")
        self.view.setBackground(BACKGROUND[:3])
        self.view.ci.setContentsMargins(2, 2, 2, 2)
        self.viewbox = self.view.addViewBox(lockAspect=True, invertY=True, enableMouse=False)
        self.viewbox.setMenuEnabled(False)
        self.image_item = pg.ImageItem(axisOrder="row-major")
        self.viewbox.addItem(self.image_item)
        self.view.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.legend = WrapLabel(_legend_html())  # wraps in a narrow dock, every line kept
        self.by_adapter = QCheckBox("colour by adapter")
        self.by_adapter.setToolTip("one colour per LoRA set the page's K/V was computed under (grey: no LoRA)")
        self.by_adapter.toggled.connect(self._recolour)
        self.hover_label = WrapLabel("hover a page to see which chat holds it")
        self.preemptions = PreemptionTable()  # per chat: pages given back, resumes, tokens recomputed
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.legend)
        layout.addWidget(self.by_adapter)  # its own line: beside the legend it squeezed the legend to a sliver
        layout.addWidget(self.hover_label)
        layout.addWidget(self.preemptions)

    def set_identifier_labels(self, mapping: Mapping[object, str]) -> None:
        """Titles shown on hover for job identifiers (e.g. chat id -> chat title)."""
        self._labels = dict(mapping)
        self.preemptions.set_labels(self._labels)

    def update_pages(self, states: Sequence[int], shared: Sequence[bool] | None = None,
                     owners: Mapping[object, object] | None = None, adapters: Sequence[int] | None = None,
                     adapter_sets: Mapping[object, list] | None = None,
                     preempted: Mapping[int, int] | None = None) -> None:
        """Show one snapshot's page table (`adapters`/`adapter_sets`/`preempted`: metrics' page_adapters,
        adapter_sets and preempted_pages)."""
        self._last = (states, shared, owners, adapters, adapter_sets, preempted)
        self._job_states = np.asarray(states, np.int64)
        self._page_adapters = None if adapters is None else np.asarray(adapters, np.int64)
        self._adapter_sets = {int(k): list(v) for k, v in (adapter_sets or {}).items()}
        shown = states
        if self.by_adapter.isChecked():
            legend = _adapter_legend_html(self._adapter_sets)
            if legend != self.legend.text():  # a new adapter set appeared
                self.legend.setText(legend)
            if adapters is not None:
                shown = self._adapter_colours()
        resized = self.pages.layout(len(states), columns_for(len(states), self._aspect))
        self._owners = {int(k): v for k, v in (owners or {}).items()}
        self._hold(set(self._owners.values()))
        by_chat = shown is states  # by adapter, codes are adapter-set ids coloured by id, not chat slots
        # a chat deleted while its stopped reply still holds pages has given its colour back: serial % n then
        slots = {serial: CHAT_COLOURS.slot(ident) for serial, ident in self._owners.items()} if by_chat else {}
        self.pages.set_slots({serial: slot for serial, slot in slots.items() if slot is not None})
        self.pages.set_preempted(preempted if by_chat else None)
        changed = self.pages.load(shown, shared)
        if changed:
            self._show(resized)
            if self._hovered is not None and self._hovered < self.pages.pages:  # keep the hover line true
                text = self.describe_page(self._hovered)
                if text != self.hover_label.text():
                    self.hover_label.setText(text)

    def _hold(self, identifiers: set) -> None:
        for ident in identifiers - self._held:
            CHAT_COLOURS.acquire(ident)
        for ident in self._held - identifiers:
            CHAT_COLOURS.release(ident)
        self._held = identifiers

    def job_rgba(self, serial: int) -> tuple[int, int, int, int]:
        """The colour the map paints a job's pages (its chat's colour when the job has an identifier)."""
        r, g, b = JOB_PALETTE[self.pages.slot_of(serial)]
        return (r, g, b, 255)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        self._hold(set())
        super().closeEvent(event)
    def _adapter_colours(self) -> np.ndarray:
        """Page codes for the adapter view: the set's id picks a palette colour; base model grey, free dark."""
        codes = self._page_adapters.copy()
        base = [i for i, pairs in self._adapter_sets.items() if not pairs]
        codes[np.isin(codes, base)] = CACHED_STATE
        codes[self._page_adapters < 0] = FREE_STATE
        return codes

    def _recolour(self) -> None:
        by_adapter = self.by_adapter.isChecked()
        self.legend.setText(_adapter_legend_html(self._adapter_sets) if by_adapter else _legend_html())
        if self._last is not None:
            self.update_pages(*self._last)

    def _show(self, resized: bool) -> None:
        image = self.pages.render()
        self.image_item.setImage(image, autoLevels=False)
        if resized:
            h, w = image.shape[:2]
            self.viewbox.setRange(xRange=(0, max(w, 1)), yRange=(0, max(h, 1)), padding=0.01)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        """Reflow the grid to the widget's shape so the map fills a tall dock as well as a wide one."""
        super().resizeEvent(event)
        size = self.view.size()
        if size.width() > 20 and size.height() > 20:
            self._aspect = size.width() / size.height()
            n = self.pages.pages
            if n and columns_for(n, self._aspect) != self.pages.cols:
                states, shared = self.pages.states.copy(), self.pages.shared.copy()
                self.pages.layout(n, columns_for(n, self._aspect))
                self.pages.load(states, shared)
                self._show(True)

    def describe_page(self, page: int) -> str:
        """Human description of one page: free, cached, or which job/chat holds it."""
        if not 0 <= page < self.pages.pages:
            raise IndexError(f"page {page} outside 0..{self.pages.pages - 1}")
        state = int(self._job_states[page]) if page < len(self._job_states) else int(self.pages.states[page])
        lora = ""
        if self._page_adapters is not None and page < len(self._page_adapters) and self._page_adapters[page] >= 0:
            lora = " · " + adapters_text(self._adapter_sets.get(int(self._page_adapters[page]), []))
        if state == FREE_STATE:
            return f"page {page}: free"
        if state == CACHED_STATE and page in self.pages.preempted:
            return (f"page {page}: cached · preempted {self._who(self.pages.preempted[page])} (it resumes from "
                    f"this page unless another job takes it first){lora}")
        if state == CACHED_STATE:
            return f"page {page}: cached (unreferenced prompt cache, reusable){lora}"
        who = self._who(state)
        shared = " · shared prefix page" if self.pages.shared[page] else ""
        return f"page {page}: in use by {who}{shared}{lora}"

    def _who(self, serial: int) -> str:
        ident = self._owners.get(serial)
        who = f"job {serial}"
        if ident is not None:
            title = self._labels.get(ident, self._labels.get(str(ident))) or CHAT_COLOURS.label(ident)
            who += f" — {title}" if title else f" — {ident}"
        return who

    def _on_mouse_moved(self, scene_pos) -> None:
        point = self.viewbox.mapSceneToView(scene_pos)
        page = self.pages.page_at(point.x(), point.y())
        if page is not None:
            self.show_page_info(page)

    def show_page_info(self, page: int) -> str:
        """Show a page's description in the hover line and tooltip (what hovering the cell does)."""
        text = self.describe_page(page)
        self._hovered = page
        self.hover_label.setText(text)
        self.view.setToolTip(text)
        if self.view.underMouse():
            QToolTip.showText(QCursor.pos(), text, self.view)
        self.page_hovered.emit(page)
        return text


def _legend_html() -> str:
    def swatch(rgba: tuple[int, ...]) -> str:  # on the map's own background, so it reads alike in any theme
        bg = "rgb({},{},{})".format(*BACKGROUND[:3])
        return f"<span style='background-color: {bg}; color: rgb({rgba[0]},{rgba[1]},{rgba[2]})'>&#9632;</span>"

    jobs = "".join(swatch(job_colour(i)) for i in range(4))
    # one line per group, so a narrow dock wraps within a group rather than splitting a key from its words
    return (f"{swatch(FREE_COLOUR)} free &nbsp; {swatch(CACHED_COLOUR)} cached &nbsp; {jobs} in use (one colour per job)"
            "<br>&#9636; hatched = shared prefix page<br>&#9633; hollow = a preempted reply's cached page"
            " (it resumes from it)")


def _adapter_legend_html(adapter_sets: Mapping[int, list]) -> str:
    def swatch(rgba: tuple[int, ...]) -> str:
        return f"<span style='color: rgb({rgba[0]},{rgba[1]},{rgba[2]})'>&#9632;</span>"

    parts = [f"{swatch(FREE_COLOUR)} free"]
    for i, pairs in sorted(adapter_sets.items()):
        colour = CACHED_COLOUR if not pairs else job_colour(i)
        parts.append(f"{swatch(colour)} {adapters_text(pairs)}")
    return " &nbsp; ".join(parts)

"""The live cache dashboard: page map plus scrolling time series fed by generator.metrics() snapshots.

The app pushes a snapshot about ten times a second while chats stream, so a push must stay cheap and
must not allocate ever-growing history: every series lives in one preallocated ring buffer that is
updated in place, and rates are derived here from the engine's raw monotonic counters.

A remote server's snapshot (app.core.remote_metrics) has the same keys, with None for what that server does
not report: such a chart says "no source" instead of drawing zeros, and without page-level data the
page map gives way to a KV-usage bar.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import (
    QComboBox, QDockWidget, QFrame, QGraphicsItem, QLabel, QProgressBar, QScrollArea, QSizePolicy, QSplitter, QVBoxLayout,
    QWidget,
)

from app.core.formatting import human_count
from app.panels.chart_grid import ChartGrid, axis_width
from app.panels.expert_map import ExpertMap
from app.panels.pagemap import PageMapWidget
from app.panels.wheel_guard import guard_wheel
from app.panels.wrap_label import WrapLabel
from engine.contract import METRICS_KEYS

SERIES_FIELDS = (
    "time", "referenced_pct", "cached_pct", "active", "pending", "deferred", "tokens_per_s",
    "acceptance_pct", "sampling_busy", "sampling_max", "tokens_total", "drafted_total", "accepted_total",
)
WARN_OCCUPANCY_PCT = 90.0
DOCK_MINIMUM_EM = 30  # the dock's least width in average characters of its font
# plots whose y range follows their curves: (plot, fields, least top of the range)
FITTED_PLOTS = (("jobs", ("active", "pending", "deferred"), 1.0), ("tokens", ("tokens_per_s",), 10.0),
                ("sampling", ("sampling_busy", "sampling_max"), 1.0))
OK_PEN = pg.mkPen((80, 200, 120), width=1)
WARN_PEN = pg.mkPen((255, 90, 60), width=2)


class RingSeries:
    """Fixed-capacity multi-field time series.

    Each sample is written twice (slot i and i + capacity), so the newest `len(self)` samples are always
    one contiguous slice: plotting needs no copy and nothing grows after construction.
    """

    def __init__(self, capacity: int, fields: Sequence[str]) -> None:
        if capacity < 2:
            raise ValueError(f"RingSeries capacity must be >= 2, got {capacity}")
        self.capacity = capacity
        self._field = {name: i for i, name in enumerate(fields)}
        self._data = np.full((len(fields), 2 * capacity), np.nan)
        self._head = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

    def append(self, values: Mapping[str, float]) -> None:
        """Add one sample; fields not given are NaN."""
        i = self._head
        self._data[:, i] = np.nan
        for name, value in values.items():
            self._data[self._field[name], i] = value
        self._data[:, i + self.capacity] = self._data[:, i]
        self._head = (i + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def set_last(self, name: str, value: float) -> None:
        """Overwrite a field of the newest sample (both copies)."""
        if not self._count:
            raise IndexError("RingSeries is empty")
        i = (self._head - 1) % self.capacity
        self._data[self._field[name], i] = self._data[self._field[name], i + self.capacity] = value

    def column(self, name: str) -> np.ndarray:
        """Newest samples of one field, oldest first, as a view into the ring."""
        start = self._head + self.capacity - self._count
        return self._data[self._field[name], start:start + self._count]

    def clear(self) -> None:
        self._data.fill(np.nan)
        self._head = self._count = 0


class _Monotonic:
    """Keeps a raw counter monotonic across generator restarts (a model reload resets it to zero)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.last_raw: float | None = None

    def __call__(self, raw: float) -> float:
        if math.isnan(raw):  # not reported (a remote server without this counter)
            return raw
        if self.last_raw is not None and raw < self.last_raw:
            self.offset += self.last_raw
        self.last_raw = raw
        return raw + self.offset


class DashboardDock(QDockWidget):
    """Dock with the page-table map and 60 s of occupancy, jobs, tokens/s, acceptance and sampler load.
    With several models loaded (compare mode) a selector picks whose generator it shows."""

    model_chosen = Signal(object)  # the chosen model's path (None: the main model)

    def __init__(self, parent: QWidget | None = None, window_s: float = 60.0, capacity: int = 1024,
                 rate_window_s: float = 2.0) -> None:
        super().__init__("Dashboard", parent)
        self.setObjectName("DashboardDock")
        if window_s <= 0 or rate_window_s <= 0:
            raise ValueError("window_s and rate_window_s must be positive")
        self.window_s = window_s
        self.rate_window_s = rate_window_s
        self.series = RingSeries(capacity, SERIES_FIELDS)
        self._x = np.zeros(capacity)  # scratch for "seconds ago" x values, reused every push
        self._counters = {k: _Monotonic() for k in ("tokens", "drafted", "accepted")}
        self._last_time: float | None = None
        self._warn = False
        self._y_top: dict[str, float] = {}
        self.tokens_per_second: float | None = None
        self.acceptance_rate: float | None = None  # over the window; None = n/a
        self.snapshot: dict | None = None
        self._build()

    # ----------------------------------------------------------------------------------- layout
    def _build(self) -> None:
        body = QWidget()
        self.page_map = PageMapWidget()
        self.charts = ChartGrid()  # one or two columns of plots; titles wrap rather than clip
        self.charts.setAccessibleName("Throughput and cache charts")
        self.charts.setBackground((18, 19, 23))
        self.charts.set_bottom_label("seconds ago")
        self.plots: dict[str, pg.PlotItem] = {}
        colours = {
            "referenced_pct": (80, 200, 120), "cached_pct": (128, 134, 150), "active": (51, 131, 187),
            "pending": (255, 127, 14), "deferred": (200, 110, 230), "tokens_per_s": (23, 190, 207),
            "acceptance_pct": (188, 189, 34), "sampling_busy": (227, 119, 194), "sampling_max": (150, 150, 150),
        }

        def key(name: str, text: str) -> str:
            r, g, b = colours[name]
            return f"<span style='color: rgb({r},{g},{b})'>&#9644;&nbsp;{text}</span>"  # a key never parts from its word

        titles = {
            # short enough to show whole in a 1280-px screen's dock (~300 px)
            "occupancy": f"pages %: {key('referenced_pct', 'in use')} {key('cached_pct', 'cached')}",
            "jobs": f"jobs: {key('active', 'batch')} {key('pending', 'pending')} {key('deferred', 'deferred')}",
            "tokens": "tokens/s (all chats)",
            "acceptance": "draft acceptance %",
            "sampling": f"sampling threads: {key('sampling_busy', 'busy')} {key('sampling_max', 'max')}",
        }
        axis = axis_width(QFontMetrics(self.charts.font()))
        for key, title in titles.items():
            plot = self.charts.add_plot(title)
            plot.setMouseEnabled(x=False, y=False)
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.setXRange(-self.window_s, 0, padding=0)
            plot.showGrid(x=True, y=True, alpha=0.15)
            plot.getAxis("left").setWidth(axis)
            for side in ("left", "bottom"):  # axes + grid repaint from a pixmap unless their range changes
                plot.getAxis(side).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            self.plots[key] = plot
        for key in ("occupancy", "acceptance"):
            self.plots[key].setYRange(0, 100, padding=0.02)
            self.plots[key].getAxis("left").setTicks([[(0, "0"), (50, "50"), (100, "100")]])
        self.plots["occupancy"].addLine(y=WARN_OCCUPANCY_PCT, pen=pg.mkPen((255, 90, 60), style=Qt.DashLine))
        fin = {"connect": "finite"}

        def curve(plot: str, **opts) -> pg.PlotCurveItem:
            item = pg.PlotCurveItem(**opts)  # lighter than PlotDataItem: no symbols/downsampling layers
            self.plots[plot].addItem(item)
            return item

        self.curves = {
            "referenced_pct": curve("occupancy", pen=OK_PEN, **fin),
            "cached_pct": curve("occupancy", pen=pg.mkPen(colours["cached_pct"], width=1), **fin),
            "active": curve("jobs", pen=pg.mkPen(colours["active"], width=1), **fin),
            "pending": curve("jobs", pen=pg.mkPen(colours["pending"], width=1), **fin),
            "deferred": curve("jobs", pen=pg.mkPen(colours["deferred"], width=1), **fin),
            "tokens_per_s": curve("tokens", pen=pg.mkPen(colours["tokens_per_s"], width=1), fillLevel=0,
                                                      brush=(*colours["tokens_per_s"], 50), **fin),
            "acceptance_pct": curve("acceptance", pen=pg.mkPen(colours["acceptance_pct"], width=1), **fin),
            "sampling_busy": curve("sampling", pen=pg.mkPen(colours["sampling_busy"], width=1), **fin),
            "sampling_max": curve("sampling", pen=pg.mkPen(colours["sampling_max"], style=Qt.DashLine),
                                                        **fin),
        }
        for plot, fields, floor in FITTED_PLOTS:  # a few ticks from the start, not pyqtgraph's crowd on 0..1
            self._fit_y(plot, fields, np.zeros(0, bool), floor)
        self.na_text = pg.TextItem("n/a — nothing drafted", color=(170, 170, 170), anchor=(0.5, 0.5))
        self.plots["acceptance"].addItem(self.na_text)
        self.na_text.setPos(-self.window_s / 2, 50)
        self.no_source: dict[str, pg.TextItem] = {}
        for key, plot in self.plots.items():
            item = pg.TextItem("no source: this server doesn't report it", color=(200, 160, 90), anchor=(0.5, 0.5))
            item.setPos(-self.window_s / 2, 50 if key in ("occupancy", "acceptance") else 0.5)
            item.setVisible(False)
            plot.addItem(item)
            self.no_source[key] = item

        # wrapped at a space at a small screen's dock width, every line kept (never clipped), never widening it
        self.pages_label, self.jobs_label, self.tokens_label = WrapLabel(), WrapLabel(), WrapLabel()
        self.acceptance_label, self.sampling_label, self.cache_label = WrapLabel(), WrapLabel(), WrapLabel()
        self.lora_label = WrapLabel("LoRA: none")
        stats = QVBoxLayout()
        stats.setContentsMargins(4, 2, 4, 2)
        stats.setSpacing(1)
        for label in (self.pages_label, self.jobs_label, self.tokens_label, self.acceptance_label,
                      self.sampling_label, self.cache_label, self.lora_label):
            label.setTextFormat(Qt.PlainText)  # plain text lays out far faster than rich text at 10 Hz
            stats.addWidget(label)
        self.acceptance_label.setText("speculative acceptance: n/a (nothing drafted)")
        lower = QWidget()
        lower_layout = QVBoxLayout(lower)
        lower_layout.setContentsMargins(0, 0, 0, 0)
        lower_layout.addLayout(stats)
        lower_layout.addWidget(self.charts, 1)
        self.kv_bar = QProgressBar()  # stands in for the page map when a server reports no pages
        self.kv_bar.setRange(0, 1000)
        self.kv_bar.setFormat("KV cache: %p % in use (this server reports no page-level data)")
        self.kv_bar.hide()
        upper = QWidget()
        upper_layout = QVBoxLayout(upper)
        upper_layout.setContentsMargins(0, 0, 0, 0)
        self.model_choice = QComboBox()  # shown with two or more models loaded
        self.model_choice.setAccessibleName("Model whose metrics are shown")
        self.model_choice.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)
        self.model_choice.hide()
        self.model_choice.activated.connect(self._model_activated)
        upper_layout.addWidget(self.model_choice)
        upper_layout.addWidget(self.page_map, 1)
        upper_layout.addWidget(self.kv_bar)
        self.expert_map = ExpertMap()  # shown for a mixture-of-experts model
        upper_layout.addWidget(self.expert_map, 1)
        splitter = QSplitter(Qt.Vertical)
        splitter.addWidget(upper)
        splitter.addWidget(lower)
        splitter.setStretchFactor(0, 2)
        splitter.setStretchFactor(1, 3)
        layout = QVBoxLayout(body)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(splitter)
        scroll = QScrollArea()  # a short screen scrolls the dashboard instead of pushing the window past it
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(body)
        guard_wheel(body)
        scroll.setAccessibleName("Dashboard panel")
        self.setWidget(scroll)
        # narrower, the charts' titles would break inside words: the dock column stops here instead
        self.setMinimumWidth(DOCK_MINIMUM_EM * QFontMetrics(self.font()).averageCharWidth())

    # ----------------------------------------------------------------------------------- feeding
    def set_identifier_labels(self, mapping: Mapping[object, str]) -> None:
        """Chat titles for job identifiers, shown when hovering the page map."""
        self.page_map.set_identifier_labels(mapping)

    def set_models(self, models: Sequence[tuple[str | None, str]]) -> None:
        """The loaded models as (path, name), the main one (path None) first."""
        current = self.model_choice.currentData()
        self.model_choice.clear()
        for path, name in models:
            self.model_choice.addItem(f"Model: {name}" + (" (main)" if path is None else ""), path)
        self.model_choice.setCurrentIndex(max(0, self.model_choice.findData(current)))
        self.model_choice.setVisible(len(models) > 1)

    def _model_activated(self, _index: int) -> None:
        self.reset()
        self.model_chosen.emit(self.model_choice.currentData())

    def reset(self) -> None:
        """Forget the history (e.g. after a model reload); the next push starts a fresh window."""
        self.series.clear()
        self.page_map.preemptions.clear_counts()
        self.expert_map.clear()
        self._counters = {k: _Monotonic() for k in ("tokens", "drafted", "accepted")}
        self._last_time = None

    def push(self, snapshot: Mapping[str, object]) -> None:
        """Take one generator.metrics() snapshot: redraw the page map, extend the series, refresh labels."""
        missing = [k for k in METRICS_KEYS if k not in snapshot]
        if missing:
            raise ValueError(f"dashboard snapshot lacks metrics() keys: {', '.join(missing)}")
        s = snapshot
        total = s["pages_total"]
        if total is not None and int(total) < 0:
            raise ValueError(f"pages_total must be >= 0, got {total}")
        kv_usage = s.get("kv_usage")
        bar = not s["page_states"] and kv_usage is not None
        if bar:
            self.kv_bar.setValue(round(min(max(float(kv_usage), 0.0), 1.0) * 1000))
        else:
            self.page_map.update_pages(s["page_states"], s["page_shared"], s["page_owner_identifiers"],
                                       s.get("page_adapters"), s.get("adapter_sets"), s.get("preempted_pages"))
        self.page_map.preemptions.push(s.get("job_preemptions"))
        self.expert_map.push(s.get("experts"))
        if bar != self.kv_bar.isVisible():
            self.kv_bar.setVisible(bar)
            self.page_map.setVisible(not bar)
        self.snapshot = dict(s)
        t = float(s["snapshot_time"])
        tokens = self._counters["tokens"](_num(s["tokens_generated_total"]))
        drafted = self._counters["drafted"](_num(s["drafted_tokens_total"]))
        accepted = self._counters["accepted"](_num(s["accepted_tokens_total"]))
        if self._last_time is None or t > self._last_time:
            self._last_time = t
            if total:
                referenced, cached = 100.0 * int(s["pages_referenced"]) / total, 100.0 * int(s["pages_cached"]) / total
            else:
                referenced, cached = 100.0 * _num(kv_usage), math.nan
            self.series.append({
                "time": t, "referenced_pct": referenced, "cached_pct": cached, "active": _num(s["active_jobs"]),
                "pending": _num(s["pending_jobs"]), "deferred": _num(s["deferred_jobs"]),
                "sampling_busy": _num(s["sampling_threads_busy"]), "sampling_max": _num(s["sampling_threads_max"]),
                "tokens_total": tokens, "drafted_total": drafted, "accepted_total": accepted,
            })
            if s.get("acceptance_gauge") is not None:  # SGLang reports a rate, not counters
                self.series.set_last("acceptance_pct", 100.0 * float(s["acceptance_gauge"]))
            self._derive_rates(t)
            self._redraw_series()
        self._refresh_labels(s)

    def _derive_rates(self, t: float) -> None:
        times = self.series.column("time")
        tok, dr, acc = (self.series.column(k) for k in ("tokens_total", "drafted_total", "accepted_total"))
        n = len(times)
        if n >= 2:
            j = min(int(np.searchsorted(times, t - self.rate_window_s - 1e-6)), n - 2)
            self.tokens_per_second = float((tok[-1] - tok[j]) / (t - times[j]))
            self.series.set_last("tokens_per_s", self.tokens_per_second)
            if dr[-1] > dr[j]:
                self.series.set_last("acceptance_pct", 100.0 * (acc[-1] - acc[j]) / (dr[-1] - dr[j]))
        w = int(np.searchsorted(times, t - self.window_s - 1e-6))
        drafted = dr[-1] - dr[w]
        self.acceptance_rate = float((acc[-1] - acc[w]) / drafted) if drafted > 0 else None

    def _redraw_series(self) -> None:
        times = self.series.column("time")
        n = len(times)
        x = self._x[:n]
        np.subtract(times, times[-1], out=x)
        for name, curve in self.curves.items():
            curve.setData(x, self.series.column(name))
        warn = self.series.column("referenced_pct")[-1] >= WARN_OCCUPANCY_PCT
        if warn != self._warn:
            self._warn = warn
            self.curves["referenced_pct"].setPen(WARN_PEN if warn else OK_PEN)
        visible = x >= -self.window_s
        for plot, fields, floor in FITTED_PLOTS:
            self._fit_y(plot, fields, visible, floor)
        s = self.snapshot or {}
        sourced = {
            "occupancy": bool(s.get("pages_total")) or s.get("kv_usage") is not None,
            "jobs": s.get("active_jobs") is not None,
            "tokens": s.get("tokens_generated_total") is not None,
            "acceptance": s.get("drafted_tokens_total") is not None or s.get("acceptance_gauge") is not None,
            "sampling": s.get("sampling_threads_busy") is not None,
        }
        for key, item in self.no_source.items():
            item.setVisible(not sourced[key])
        self.na_text.setVisible(self.acceptance_rate is None and sourced["acceptance"]
                                and s.get("acceptance_gauge") is None)

    def _fit_y(self, plot: str, fields: Sequence[str], visible: np.ndarray, floor: float) -> None:
        """Y range from 0 to the visible maximum; grows at once, shrinks only when far too tall (no jitter)."""
        peak = floor
        for f in fields:
            col = self.series.column(f)[visible]
            if col.size and np.isfinite(col).any():
                peak = max(peak, float(np.nanmax(col)))
        top = self._y_top.get(plot)
        if top is None or peak > top or peak < 0.4 * top:
            self._y_top[plot] = top = peak * 1.15
            self.plots[plot].setYRange(0, top, padding=0)
            step = _nice_step(top / 3)  # 2-3 labels: the plots are too short for pyqtgraph's default density
            self.plots[plot].getAxis("left").setTickSpacing(major=step, minor=step)

    def _refresh_labels(self, s: Mapping[str, object]) -> None:
        total = s["pages_total"]
        if total is None:  # a remote without page data: KV usage is all there is
            kv = s.get("kv_usage")
            _set_text(self.pages_label, "pages: n/a (no page-level data) · KV usage "
                                        + ("n/a" if kv is None else f"{100 * float(kv):.1f} %"))
            warn = False
        else:
            total = int(total) or 1
            ref, cached, free = int(s["pages_referenced"]), int(s["pages_cached"]), int(s["pages_free"])
            warn = 100.0 * ref / total >= WARN_OCCUPANCY_PCT
            _set_text(self.pages_label, f"pages: {ref} in use · {cached} cached · {free} free / {s['pages_total']}"
                                        + ("  (nearly full)" if warn else ""))
        if warn != self.pages_label.property("warn"):
            self.pages_label.setProperty("warn", warn)
            self.pages_label.setStyleSheet("color: #e0442a; font-weight: bold;" if warn else "")
        _set_text(self.jobs_label, f"jobs: {_na(s['active_jobs'])} active (step batch {_na(s['batch_size'])}) · "
                                   f"{_na(s['pending_jobs'])} pending · {_na(s['deferred_jobs'])} deferred")
        tps = "–" if self.tokens_per_second is None or not math.isfinite(self.tokens_per_second) \
            else f"{self.tokens_per_second:,.1f}"
        _set_text(self.tokens_label, f"tokens/s: {tps} · last step: {_na(s['prefill_tokens_step'])} prefill, "
                                     f"{_na(s['decode_tokens_step'])} decode tokens")
        if s.get("acceptance_gauge") is not None:
            _set_text(self.acceptance_label, f"speculative acceptance: {100 * float(s['acceptance_gauge']):.1f} % "
                                             "(server's rate)")
        elif s["drafted_tokens_total"] is None:
            _set_text(self.acceptance_label, "speculative acceptance: no source (not reported)")
        elif self.acceptance_rate is None:
            _set_text(self.acceptance_label, "speculative acceptance: n/a (nothing drafted)")
        else:
            per_pos = " · ".join(human_count(float(v)) for v in list(s["accepted_per_position"])[:8])
            _set_text(self.acceptance_label, f"speculative acceptance: {100 * self.acceptance_rate:.1f} % "
                                             f"(last {self.window_s:.0f} s) · accepted by draft position: {per_pos}")
        _set_text(self.sampling_label,
                  f"sampling threads: {_na(s['sampling_threads_busy'])} / {_na(s['sampling_threads_max'])} busy")
        hits = s["prefix_hit_tokens_total"]
        if hits is None and s.get("prefix_hit_rate_gauge") is not None:
            hit_text = f"prefix-cache hit rate: {100 * float(s['prefix_hit_rate_gauge']):.1f} %"
        else:
            hit_text = f"prefix-cache hits: {'n/a' if hits is None else human_count(float(hits)) + ' tokens'}"
        steps = s["steps_total"]
        _set_text(self.cache_label, f"{hit_text} · steps: {'n/a' if steps is None else human_count(float(steps))}")
        loras = s["loras"]
        _set_text(self.lora_label, "LoRA: " + ("n/a" if loras is None else ", ".join(str(x) for x in loras) or "none"))


def _num(value: object) -> float:
    """A snapshot value as a float; None (not reported by a remote) is NaN, a gap in the chart."""
    return math.nan if value is None else float(value)


def _na(value: object) -> str:
    return "n/a" if value is None else str(value)


def _set_text(label: QLabel, text: str) -> None:
    """A label relayout + repaint costs more than everything else in a push; skip it when unchanged."""
    if label.text() != text:
        label.setText(text)


def _nice_step(raw: float) -> float:
    """Smallest 1/2/5 x 10^k step >= raw."""
    exp = 10.0 ** math.floor(math.log10(max(raw, 1e-9)))
    return next(m * exp for m in (1, 2, 5, 10) if m * exp >= raw)

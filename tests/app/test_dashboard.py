"""Dashboard dock and page map, fed with plain dicts shaped exactly like generator.metrics()."""
import subprocess
import sys

import numpy as np
import pytest
from PySide6.QtCore import QEvent, QPointF, Qt
from PySide6.QtGui import QColor, QMouseEvent
from PySide6.QtWidgets import QApplication

from app.panels.dashboard import WARN_PEN, DashboardDock, RingSeries
from app.panels.pagemap import BACKGROUND, CACHED_COLOUR, FREE_COLOUR, HATCH_COLOUR, job_colour


def snapshot(states, t, shared=None, owners=None, tokens=0, drafted=0, accepted=0, **over):
    """A metrics() dict; counts are derived from `states` like the generator does."""
    states = list(states)
    d = {
        "pages_total": len(states), "pages_referenced": sum(s >= 0 for s in states),
        "pages_cached": sum(s == -1 for s in states), "pages_free": sum(s == -2 for s in states),
        "page_states": states, "page_shared": list(shared) if shared is not None else [False] * len(states),
        "page_owner_identifiers": owners or {}, "active_jobs": 0, "pending_jobs": 0, "deferred_jobs": 0,
        "batch_size": 0, "prefill_tokens_step": 0, "decode_tokens_step": 0, "tokens_generated_total": tokens,
        "prefill_tokens_total": 0, "steps_total": 0, "time_total_s": 0.0, "drafted_tokens_total": drafted,
        "accepted_tokens_total": accepted, "accepted_per_position": [], "sampling_threads_busy": 0,
        "sampling_threads_max": 16, "prefix_hit_tokens_total": 0, "loras": [], "snapshot_time": t,
        "page_size": 256, "step_host_overhead_s": 0.0, "batch_size_peak": 0, "prompt_tokens_total": 0,
        "drafts_total": 0, "loras_loaded": [],
        "preemptions_total": 0, "resumes_total": 0, "recomputed_tokens_total": 0,
        "job_preemptions": {}, "preempted_pages": {},
        "page_adapters": [-1 if s == -2 else 0 for s in states], "adapter_sets": {0: []},
        "experts": None,
    }
    d.update(over)
    return d


@pytest.fixture
def dock(qtbot):
    d = DashboardDock()
    qtbot.addWidget(d)
    d.resize(500, 900)
    d.show()
    qtbot.waitExposed(d)
    return d


# page map: 0..3 free, 4..5 cached, 6..8 job 3 (6 shared), 9..10 job 7, rest free
STATES = [-2, -2, -2, -2, -1, -1, 3, 3, 3, 7, 7] + [-2] * 29
SHARED = [False] * 40
SHARED[6] = True


def cell_pixel(dock, page, dx=0, dy=0):
    pages = dock.page_map.pages
    x, y = pages.cell_origin(page)
    return tuple(int(v) for v in pages.rgba[y + dy, x + dx])


def test_page_map_colours_each_cell_by_state(dock, monkeypatch):
    """(A fresh colour book: chats earlier tests left open may fill the palette, and past it colours repeat.)"""
    import app.panels.pagemap as pagemap
    from app.core.chat_colours import ColourBook

    monkeypatch.setattr(pagemap, "CHAT_COLOURS", ColourBook())
    dock.push(snapshot(STATES, 1.0, SHARED, owners={3: "chat-a", 7: "chat-b"}))
    cell = dock.page_map.pages.cell
    for page in range(4):
        assert cell_pixel(dock, page, 1, 2) == FREE_COLOUR
    for page in (4, 5):
        assert cell_pixel(dock, page, 1, 2) == CACHED_COLOUR
    a, b = dock.page_map.job_rgba(3), dock.page_map.job_rgba(7)  # the colours of chat-a and chat-b
    for page in (7, 8):
        assert cell_pixel(dock, page, 1, 2) == a
    for page in (9, 10):
        assert cell_pixel(dock, page, 1, 2) == b
    assert a != b
    # the gap row/column around every cell is background
    assert cell_pixel(dock, 7, cell - 1, 0) == BACKGROUND
    assert cell_pixel(dock, 7, 0, cell - 1) == BACKGROUND
    # shared page 6: hatch on the diagonals, owner colour in between; unshared page 7 has no hatch
    assert cell_pixel(dock, 6, 0, 0) == HATCH_COLOUR
    assert cell_pixel(dock, 6, 1, 2) == HATCH_COLOUR  # (1 + 2) % 3 == 0
    assert cell_pixel(dock, 6, 0, 1) == a
    assert cell_pixel(dock, 7, 0, 0) == a
    # the next snapshot (no identifiers: colours by serial) moves page 0 to job 3 and frees page 9
    states = list(STATES)
    states[0], states[9] = 3, -2
    dock.push(snapshot(states, 1.1, SHARED))
    assert cell_pixel(dock, 0, 1, 2) == job_colour(3)
    assert cell_pixel(dock, 9, 1, 2) == FREE_COLOUR


def test_page_map_is_painted_on_screen(dock, qtbot):
    dock.push(snapshot(STATES, 1.0, SHARED))
    QApplication.processEvents()
    view = dock.page_map.view
    image = view.grab().toImage()
    pages = dock.page_map.pages

    def screen_colour(page):
        x, y = pages.cell_origin(page)
        centre = dock.page_map.viewbox.mapViewToScene(QPointF(x + 3.5, y + 3.5))
        p = view.mapFromScene(centre)
        c = QColor(image.pixel(p.x(), p.y()))
        return (c.red(), c.green(), c.blue())

    assert screen_colour(1) == FREE_COLOUR[:3]
    assert screen_colour(4) == CACHED_COLOUR[:3]
    assert screen_colour(10) == job_colour(7)[:3]


def test_hover_names_the_chat(dock, qtbot):
    dock.set_identifier_labels({"chat-a": "Trip to Lisbon"})
    dock.push(snapshot(STATES, 1.0, SHARED, owners={3: "chat-a", 7: "chat-b"}))
    QApplication.processEvents()
    pm = dock.page_map
    x, y = pm.pages.cell_origin(6)
    pos = pm.view.mapFromScene(pm.viewbox.mapViewToScene(QPointF(x + 2.5, y + 2.5)))
    with qtbot.waitSignal(pm.page_hovered) as hovered:
        event = QMouseEvent(QEvent.MouseMove, QPointF(pos), QPointF(pm.view.viewport().mapToGlobal(pos)),
                            Qt.NoButton, Qt.NoButton, Qt.NoModifier)
        QApplication.sendEvent(pm.view.viewport(), event)
    assert hovered.args == [6]
    assert "Trip to Lisbon" in pm.hover_label.text() and "shared" in pm.hover_label.text()
    assert "chat-b" in pm.describe_page(9)  # no title known: the identifier itself
    assert "cached" in pm.describe_page(4) and "free" in pm.describe_page(0)


def test_ring_buffers_do_not_grow(qtbot):
    dock = DashboardDock(capacity=64)
    qtbot.addWidget(dock)
    dock.push(snapshot(STATES, 0.0))
    ring_bytes, image = dock.series.nbytes, dock.page_map.pages.rgba
    for i in range(1, 200):
        states = list(STATES)
        states[i % 40] = i % 5  # the map changes every push
        dock.push(snapshot(states, i * 0.1, tokens=i * 10))
    assert dock.series.nbytes == ring_bytes and len(dock.series) == 64
    assert dock.page_map.pages.rgba is image  # rendered in place
    times = dock.series.column("time")
    np.testing.assert_allclose(times, np.arange(136, 200) * 0.1)
    assert np.shares_memory(times, dock.series._data)  # plotting reads a view, not a copy
    x, y = dock.curves["tokens_per_s"].getData()
    assert len(x) == 64 and x[-1] == 0.0 and x[0] == pytest.approx(-6.3)


def test_ring_series_order_after_wrap():
    ring = RingSeries(4, ("a",))
    for v in range(10):
        ring.append({"a": v})
    assert ring.column("a").tolist() == [6, 7, 8, 9]
    ring.set_last("a", 99)
    assert ring.column("a").tolist() == [6, 7, 8, 99]
    with pytest.raises(ValueError, match="capacity"):
        RingSeries(1, ("a",))


def test_tokens_per_second_from_counter_deltas(dock):
    for i in range(20):  # 30 tokens every 0.1 s
        dock.push(snapshot(STATES, 100.0 + i * 0.1, tokens=1000 + 30 * i))
    assert dock.tokens_per_second == pytest.approx(300.0)
    assert dock.series.column("tokens_per_s")[-1] == pytest.approx(300.0)
    assert "300.0" in dock.tokens_label.text()
    for i in range(20, 45):  # idle: counters stop, the rate falls to zero and the last values stay
        dock.push(snapshot(STATES, 100.0 + i * 0.1, tokens=1000 + 30 * 19))
    assert dock.tokens_per_second == pytest.approx(0.0)
    # a new generator (model reload) restarts its counters: no negative rate
    for i in range(45, 75):
        dock.push(snapshot(STATES, 100.0 + i * 0.1, tokens=50 * (i - 45)))
    assert dock.tokens_per_second == pytest.approx(500.0)
    assert np.nanmin(dock.series.column("tokens_per_s")) >= 0


def test_duplicate_snapshot_time_adds_no_sample(dock):
    dock.push(snapshot(STATES, 5.0, tokens=10))
    dock.push(snapshot(STATES, 5.0, tokens=10, active_jobs=3))
    assert len(dock.series) == 1
    assert "3 active" in dock.jobs_label.text()  # labels still show the newest values


def test_acceptance_rate_is_na_until_something_is_drafted(qtbot):
    dock = DashboardDock(window_s=5.0)
    qtbot.addWidget(dock)
    for i in range(30):
        dock.push(snapshot(STATES, i * 0.1, tokens=10 * i))
    assert dock.acceptance_rate is None
    assert "n/a" in dock.acceptance_label.text()
    assert dock.na_text.isVisible()
    assert np.isnan(dock.series.column("acceptance_pct")).all()
    for i in range(30, 60):  # 8 drafted, 6 accepted per step
        dock.push(snapshot(STATES, i * 0.1, drafted=8 * (i - 29), accepted=6 * (i - 29),
                           accepted_per_position=[4, 2]))
    assert dock.acceptance_rate == pytest.approx(0.75)
    assert not dock.na_text.isVisible()
    assert "75.0 %" in dock.acceptance_label.text()
    assert dock.series.column("acceptance_pct")[-1] == pytest.approx(75.0)
    for i in range(60, 120):  # drafting stops; once the 5 s window holds no drafts it is n/a again
        dock.push(snapshot(STATES, i * 0.1, drafted=8 * 30, accepted=6 * 30))
    assert dock.acceptance_rate is None and "n/a" in dock.acceptance_label.text()


def test_occupancy_series_and_warning_colour(dock):
    states = [0] * 19 + [-1]  # 95 % referenced, 5 % cached
    dock.push(snapshot(STATES, 0.0))
    assert dock.curves["referenced_pct"].opts["pen"].color() != WARN_PEN.color()
    dock.push(snapshot(states, 0.1))
    assert dock.series.column("referenced_pct")[-1] == pytest.approx(95.0)
    assert dock.series.column("cached_pct")[-1] == pytest.approx(5.0)
    assert dock.curves["referenced_pct"].opts["pen"].color() == WARN_PEN.color()
    assert "nearly full" in dock.pages_label.text()


def test_jobs_sampling_and_lora_labels(dock):
    dock.push(snapshot(STATES, 0.0, active_jobs=5, pending_jobs=2, deferred_jobs=1, batch_size=5,
                       sampling_threads_busy=4, loras=["pirate-style"]))
    assert dock.series.column("deferred")[-1] == 1 and dock.series.column("pending")[-1] == 2
    assert "5 active" in dock.jobs_label.text() and "1 deferred" in dock.jobs_label.text()
    assert "4 / 16" in dock.sampling_label.text()
    assert "pirate-style" in dock.lora_label.text()


def test_bad_snapshots_are_rejected_clearly(dock):
    bad = snapshot(STATES, 0.0)
    del bad["deferred_jobs"]
    with pytest.raises(ValueError, match="deferred_jobs"):
        dock.push(bad)
    wrong = snapshot(STATES, 0.0)
    wrong["pages_total"] = 41
    wrong["page_shared"] = [False] * 39
    with pytest.raises(ValueError, match="page_shared"):
        dock.push(wrong)
    with pytest.raises(ValueError, match="valid are"):
        dock.push(snapshot([-3] + STATES[1:], 0.0))


def test_app_modules_never_import_torch():
    """Every app module loads without torch: the engine (and torch) load only with a model."""
    code = ("import sys, os, pkgutil, importlib, app; os.environ['QT_QPA_PLATFORM'] = 'offscreen'; "
            "names = [m.name for m in pkgutil.walk_packages(app.__path__, 'app.') if m.name != 'app.__main__']; "
            "[importlib.import_module(n) for n in names]; "
            "assert len(names) > 10, names; "
            "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hover_line_follows_page_changes(dock):
    dock.push(snapshot(STATES, 1.0, SHARED, owners={3: "chat-a"}))
    dock.page_map.show_page_info(7)
    assert "job 3" in dock.page_map.hover_label.text()
    states = list(STATES)
    states[7] = -1
    dock.push(snapshot(states, 1.1, SHARED))
    assert "cached" in dock.page_map.hover_label.text()


def test_a_preempted_replys_cached_pages_are_hollow_in_its_colour(dock, monkeypatch):
    """Pages 4..5 are cached; page 5 still holds the K/V of job 9 (chat-c, preempted and queued): a frame in
    chat-c's colour around the cached grey, named on hover, explained in the legend; page 4 stays plain cached."""
    import app.panels.pagemap as pagemap
    from app.core.chat_colours import ColourBook

    monkeypatch.setattr(pagemap, "CHAT_COLOURS", ColourBook())
    dock.set_identifier_labels({"chat-c": "Packing list"})
    dock.push(snapshot(STATES, 1.0, SHARED, owners={3: "chat-a", 7: "chat-b", 9: "chat-c"},
                       preempted_pages={5: 9}))
    pm = dock.page_map
    frame = pm.job_rgba(9)
    assert frame not in (CACHED_COLOUR, FREE_COLOUR)
    assert cell_pixel(dock, 5, 0, 0) == frame and cell_pixel(dock, 5, 0, 3) == frame
    assert cell_pixel(dock, 5, 3, 3) == CACHED_COLOUR
    assert cell_pixel(dock, 4, 0, 0) == CACHED_COLOUR
    assert "preempted" in pm.describe_page(5) and "Packing list" in pm.describe_page(5)
    assert "preempted" not in pm.describe_page(4)
    assert "hollow" in pm.legend.text()
    dock.push(snapshot(STATES, 1.1, SHARED, owners={3: "chat-a", 7: "chat-b"}))  # resumed: plain again
    assert cell_pixel(dock, 5, 0, 0) == CACHED_COLOUR


def test_preemptions_are_counted_per_chat(dock):
    """job_preemptions by serial: a chat's replies (its N-replies versions too) add up in one row, batch rows per
    run, API requests in one row; a job that ended keeps counting; nothing preempted hides the table."""
    table = dock.page_map.preemptions
    dock.push(snapshot(STATES, 1.0))
    assert not table.isVisibleTo(dock) and table.rowCount() == 0
    dock.set_identifier_labels({4: "Rivers", 5: "Mountains"})

    def c(ident, p, r, t):
        return {"identifier": ident, "preemptions": p, "resumes": r, "recomputed_tokens": t}

    dock.push(snapshot(STATES, 1.1, job_preemptions={1: c(4, 1, 0, 0), 2: c((4, 1), 2, 2, 30),
                                                     3: c(("batch", 2, 7), 1, 1, 5), 8: c("chatcmpl-1", 1, 1, 0)}))
    assert table.per_chat() == {4: (3, 2, 30), ("batch", 2): (1, 1, 5), "api": (1, 1, 0)}
    dock.push(snapshot(STATES, 1.2, job_preemptions={1: c(4, 1, 1, 12), 9: c(5, 1, 0, 0)}))  # 2, 3, 8 ended
    assert table.per_chat() == {4: (3, 3, 42), ("batch", 2): (1, 1, 5), "api": (1, 1, 0), 5: (1, 0, 0)}
    assert table.isVisibleTo(dock) and table.rowCount() == 4
    rows = {table.item(i, 0).text(): [table.item(i, j).text() for j in (1, 2, 3)] for i in range(4)}
    assert rows == {"Rivers": ["3", "3", "42"], "Batch run 2": ["1", "1", "5"], "API requests": ["1", "1", "0"],
                    "Mountains": ["1", "0", "0"]}
    dock.reset()  # another model or source: its serials are not these
    assert table.per_chat() == {} and not table.isVisibleTo(dock)

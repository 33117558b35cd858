"""The dashboard's expert map (app.panels.expert_map): shown for a mixture-of-experts model and not for a dense
one, its cells follow the fed counts, and hovering a chat pane shows that chat's routing."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPoint
from PySide6.QtGui import QCursor

from app.core.chat_colours import CHAT_COLOURS
from app.core.store import ChatSettings
from app.panels.expert_map import ExpertMap
from app.preferences.design_tokens import roles
from app.preferences.theme import is_dark
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("moe") / "tiny-qwen3moe", "qwen3moe", tie=False, seed=4,
                            num_hidden_layers=4, mlp_only_layers=[])


def experts(counts, jobs=None, identifiers=None, steps_total=1):
    """metrics()' `experts` (engine.generator.expert_stats) for counts (layers, experts)."""
    counts = np.asarray(counts)
    return {"layers": list(range(counts.shape[0])), "num_experts": counts.shape[1], "top_k": 2, "window": 64,
            "steps": 5, "steps_total": steps_total, "rows": int(counts.sum()) // 2, "counts": counts,
            "jobs": jobs or {}, "identifiers": identifiers or {}, "read_bytes_per_token": 1000.0,
            "top_k_bytes_per_token": 4096, "dense_bytes_per_token": 16384}


def cell_rgb(widget: ExpertMap, row: int, col: int) -> tuple:
    """The painted colour at the middle of a cell."""
    area = widget.grid.cells()
    layers, n = widget.counts.shape
    x = area.left() + (2 * col + 1) * area.width() // (2 * n)
    y = area.top() + (2 * row + 1) * area.height() // (2 * layers)
    return widget.grid.grab().toImage().pixelColor(x, y).getRgb()[:3]


def test_cells_follow_the_fed_counts(qtbot):
    widget = ExpertMap()
    qtbot.addWidget(widget)
    widget.resize(400, 300)
    widget.push(experts([[0, 5, 10], [10, 0, 0]]))
    widget.show()
    qtbot.waitExposed(widget)
    c = roles(is_dark(widget.palette()))
    assert cell_rgb(widget, 0, 0) == c.chip and cell_rgb(widget, 0, 2) == c.role_label == cell_rgb(widget, 1, 0)
    half = cell_rgb(widget, 0, 1)
    assert all(min(a, b) < h < max(a, b) for a, b, h in zip(c.chip, c.role_label, half))
    assert "10 rows" in widget.accessibleDescription() and "Busiest: layer 0, expert 2" in widget.accessibleDescription()
    assert "4.0 KiB" in widget.bytes_label.text() and "16.0 KiB" in widget.bytes_label.text()
    assert widget.describe_cell(0, 1) == "layer 0 · expert 1: 5 rows (all chats)"
    widget.push(experts([[10, 0, 0], [0, 0, 10]], steps_total=2))  # the next snapshot repaints
    assert cell_rgb(widget, 0, 0) == c.role_label and cell_rgb(widget, 0, 2) == c.chip == cell_rgb(widget, 1, 0)
    widget.push(None)  # a dense model (or a remote server): no map
    assert not widget.isVisible()


def test_map_shows_for_a_moe_model_and_follows_the_hovered_chat(qtbot, loop, store, tiny_moe):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_moe))
        window.resize(1366, 768)
        expert_map = window.dashboard.expert_map
        panes = [window.new_chat(f"chat {i}") for i in range(2)]
        window.chats.show_side_by_side(panes)
        for i, pane in enumerate(panes):
            pane.session.set_settings(ChatSettings(max_new_tokens=20, seed=i, system_prompt=""))
            pane.prompt.setPlainText(f"question {i}")
        for pane in panes:
            pane.submit()
        await wait_until(lambda: all(not p.session.running for p in panes) and panes[0].session.messages, 120,
                         "both replies")
        gen = window.service.generator
        steps = gen.metrics()["experts"]["steps_total"]
        await wait_until(lambda: expert_map.experts is not None and expert_map.experts["steps_total"] == steps, 10,
                         "the dashboard's snapshot of the last step")
        assert expert_map.isVisible() and expert_map.grid.isVisible() and expert_map.grid.height() >= 60
        snap = expert_map.experts
        assert snap["steps"] == steps <= snap["window"]  # both replies' every step is still in the window
        chats = {p.session.chat_id for p in panes}
        assert {ident for ident in snap["identifiers"].values()} == chats

        def own(chat_id):
            return sum(c for s, c in snap["jobs"].items() if snap["identifiers"][s] == chat_id)

        for pane in panes:
            chat_id = pane.session.chat_id
            QCursor.setPos(pane.mapToGlobal(QPoint(40, pane.height() // 2)))  # (the offscreen screen is 800 px wide)
            await wait_until(lambda: expert_map.chat == chat_id, 5, f"the map following chat {chat_id}")
            assert expert_map.chat_how == "hovered"
            np.testing.assert_array_equal(expert_map.counts, own(chat_id))
            assert "chat" in expert_map.title.text() and "hovered pane" in expert_map.title.text()
            row, col = np.unravel_index(int(np.argmax(own(chat_id))), own(chat_id).shape)
            assert cell_rgb(expert_map, row, col) == CHAT_COLOURS.colour(chat_id)  # the chat's own colour
        map_point = expert_map.grid.mapToGlobal(QPoint(2, 2))
        QCursor.setPos(map_point)  # off the panes, none focused: every chat's rows
        window.dashboard.setFocus()
        await wait_until(lambda: expert_map.chat is None, 5, "the map showing every chat")
        np.testing.assert_array_equal(expert_map.counts, snap["counts"])
        assert (snap["counts"] == own(panes[0].session.chat_id) + own(panes[1].session.chat_id)).all()
        window.activateWindow()
        second = panes[1].session.chat_id
        panes[1].prompt.setFocus()  # the pointer still off the panes: the focused chat's routing
        await wait_until(lambda: expert_map.chat == second, 5, "the map following the focused chat")
        assert expert_map.chat_how == "focused" and "focused pane" in expert_map.title.text()
        np.testing.assert_array_equal(expert_map.counts, own(second))
        await window.service.close()

    run(loop, body(), 200)


def test_no_map_for_a_dense_model(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat("dense")
        pane.session.set_settings(ChatSettings(max_new_tokens=4, seed=1, system_prompt=""))
        pane.prompt.setPlainText("hello")
        pane.submit()
        await wait_until(lambda: not pane.session.running and pane.session.messages, 60, "the reply")
        pushed = []
        window.service.metrics.connect(pushed.append)
        await wait_until(lambda: len(pushed) >= 2, 10, "two dashboard snapshots")
        dashboard = window.dashboard
        assert pushed[-1]["experts"] is None and dashboard.expert_map.isHidden()
        assert dashboard.page_map.isVisibleTo(dashboard) and not dashboard.expert_map.isVisibleTo(dashboard)
        await window.service.close()

    run(loop, body(), 120)

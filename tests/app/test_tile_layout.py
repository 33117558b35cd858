"""Three and four tiles on 1366x768 and 1280x720 screens: every pane gets an equal share and its message
box stays at least COMPOSER_MIN px wide (the side docks give up width first), and a narrow pane's status
line shows the reply state and a short context meter whole, with the rest (whole stats line, context,
prompt format) folded into its Details button.

Each screen size runs in a child process whose offscreen Qt platform has exactly that screen, as
tests/app/test_screen_fit.py does, so the window sizes itself and its docks as on a first start.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication

from app.core.store import ReplyStats

from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[2]
COMPOSER_MIN = 240

CHILD = r"""
import json, tempfile
from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QApplication
from app.core.store import Store
from app.window.main_window import MainWindow

app = QApplication([])
data = tempfile.mkdtemp()
win = MainWindow(Store.open(data), state_path=data + "/state.ini")
win.show()
win.new_chat()
out = {}
for tiles in (3, 4):
    win.view_actions[("tiles", tiles)].trigger()  # as the View menu does: new chats fill the tiles
    for _ in range(5):
        app.processEvents()
    panes = [p for p in win.chats.panes.values() if p.isVisible()]
    out[tiles] = {"window": [win.width(), win.height()],
                  "panes": [{"width": p.width(), "prompt": p.prompt.width(),
                             "right": p.prompt.mapTo(win, QPoint(p.prompt.width(), 0)).x(),
                             "send_right": p.send_btn.mapTo(win, QPoint(p.send_btn.width(), 0)).x()}
                            for p in panes]}
print(json.dumps(out))
"""


def _child(tmp_path, width: int, height: int) -> dict:
    config = tmp_path / "screen.json"
    config.write_text(json.dumps({"screens": [{"name": "test", "x": 0, "y": 0, "width": width, "height": height,
                                               "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "QT_QPA_PLATFORM": f"offscreen:configfile={config}"}
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("width,height", [(1366, 768), (1280, 720)])
def test_every_composer_keeps_its_width_at_three_and_four_tiles(tmp_path, width, height):
    shown = _child(tmp_path, width, height)
    for tiles in ("3", "4"):
        panes = shown[tiles]["panes"]
        window_width = shown[tiles]["window"][0]
        assert len(panes) == int(tiles), shown
        for p in panes:
            assert p["prompt"] >= COMPOSER_MIN, (tiles, p)
            assert p["right"] <= window_width and p["send_right"] <= window_width, (tiles, p)  # not clipped
        widths = [p["width"] for p in panes]
        assert max(widths) - min(widths) <= 2, (tiles, widths)  # equal shares


def test_a_narrow_pane_folds_its_status_into_details(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        window.resize(1280, 720)
        pane = window.new_chat("narrow")
        stats = ReplyStats(state="done", prompt_tokens=1234, cached_tokens=0, new_tokens=56, tokens_per_s=12.5,
                           adapters="[]")
        store.add_message(pane.session.chat_id, "user", "Tell me about the harbour.")
        store.add_message(pane.session.chat_id, "assistant", "It has boats.", stats=stats)
        pane.session.reload()
        window.view_actions[("tiles", 3)].trigger()
        await wait_until(lambda: len([p for p in window.chats.panes.values() if p.isVisible()]) == 3)
        QApplication.processEvents()
        assert pane.width() < 300 and pane.prompt.width() >= COMPOSER_MIN  # a narrow tile
        meter, state = pane.meter, pane.state
        limit = window.service.context_limit(pane.session.settings)
        assert meter.text() == f"context 1290 / {limit} tok"
        short = meter.shown() != meter.text()  # whole, or its short form ("1290/4k"), never cut off
        assert not short or (meter.shown().startswith("1290/") and "…" not in meter.shown()), meter.shown()
        assert state.shown() == state.text() == "done"
        details = pane.details_btn.toolTip()
        assert f"Context: 1290 / {limit} tok" in details
        assert "Prompt format:" in details and "Last reply: done · prompt 1234 tok" in details
        assert "12.5 tok/s · no LoRA" in details
        assert pane.details_btn.accessibleDescription() == details
        assert not pane.prompt_format.isVisible()  # folded away from the status line
        await window.service.close()

    run(loop, body())

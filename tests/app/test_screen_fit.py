"""The window opens fully usable on 1366x768 and 1280x720 screens and never grows past
the screen's available area, whatever the chats show (long titles in four tiles included).

Each screen size runs in a child process whose offscreen Qt platform has exactly that screen (the offscreen
plugin's configfile), so the window sizes itself from its real screen on first show as the app does.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, tempfile
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QApplication, QDockWidget
from app.core.store import Store
from app.window.main_window import MainWindow

app = QApplication([])
data = tempfile.mkdtemp()
win = MainWindow(Store.open(data), state_path=data + "/state.ini")
win.show()
win.new_chat()  # as the app's first start does (app.window.main_window.MainWindow.restore_session)
app.processEvents()

def rect(r):
    return [r.x(), r.y(), r.width(), r.height()]

def report(label):
    for _ in range(5):  # splitters lay out new children in posted events
        app.processEvents()
    panes = [p for p in win.chats.panes.values() if p.isVisible()]
    inside = lambda w: rect(QRect(w.mapTo(win, QPoint(0, 0)), w.size()))
    return {"label": label, "available": rect(win.screen().availableGeometry()), "frame": rect(win.frameGeometry()),
            "window": rect(win.geometry()), "minimum": [win.minimumSizeHint().width(), win.minimumSizeHint().height()],
            "status": inside(win.statusBar()), "prompts": [inside(p.prompt) for p in panes],
            "right_docks": sorted(d.objectName() for d in win.tabifiedDockWidgets(win.dashboard))}

out = [report("first start")]
panes = [win.new_chat(f"chat {i}") for i in range(3)]
win.chats.set_view("tiles", 4)
out.append(report("four tiles"))
for pane in panes:  # how the panes lay out long titles is theirs; the window must not grow
    win.store.rename_chat(pane.session.chat_id, "a long chat title: the first 48 characters of a message " * 2)
    win.chats.renamed(pane.session.chat_id, win.store.chat(pane.session.chat_id).title)
out.append(report("long titles"))
print(json.dumps(out))
"""


@pytest.mark.parametrize("width,height", [(1366, 768), (1280, 720)])
def test_window_fits_the_screen(tmp_path, width, height):
    config = tmp_path / "screen.json"
    config.write_text(json.dumps({"screens": [{"name": "test", "x": 0, "y": 0, "width": width, "height": height,
                                               "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "QT_QPA_PLATFORM": f"offscreen:configfile={config}"}
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    for r in json.loads(out.stdout.splitlines()[-1]):
        ax, ay, aw, ah = r["available"]
        assert (aw, ah) == (width, height)
        x, y, w, h = r["frame"]
        assert ax <= x and ay <= y and x + w <= ax + aw and y + h <= ay + ah, r
        assert r["minimum"][0] <= 1024 and r["minimum"][1] <= 700, r
        _, wy, ww, wh = r["window"]
        sx, sy, sw, sh = r["status"]
        assert sy + sh <= wh and sx + sw <= ww, r  # the status bar is on screen
        if r["label"] == "long titles":
            continue
        assert len(r["prompts"]) == (1 if r["label"] == "first start" else 4), r
        for px, py, pw, ph in r["prompts"]:  # every shown message box is inside the window, big enough to type in
            assert px >= 0 and py >= 0 and px + pw <= ww and py + ph <= wh and pw >= 80 and ph >= 20, r
        assert r["right_docks"] == ["Batch", "Discover", "LoRA", "Model", "Server"], r  # one tabbed column, not a stack

"""Fonts at 200 %: with the application font twice the desktop's default and Qt scaling the screen by 2
(QT_SCALE_FACTOR=2 on a 2732x1536 screen: 1366x768 logical, devicePixelRatio 2), every visible label and
button of the main window, its docks and chat pane shows its text whole (or elided with "…" and the whole
text in its tooltip), wrapped text keeps every line, the dashboard's plots stay in their view, the dock tabs
show whole titles, the status message stops short of the model's label, and the message box keeps a usable
width; the right side's panels give way to their
icon rail by themselves.

The window runs in a child process whose offscreen Qt platform has exactly that screen and scale, as
tests/app/test_screen_fit.py does, so it sizes itself on first show as the app does.
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
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QAbstractButton, QApplication, QDockWidget, QLabel, QTabBar, QToolButton

app = QApplication([])
base = app.font().pointSizeF()
font = app.font()
font.setPointSizeF(base * float(sys.argv[1]))
app.setFont(font)
from app.core.store import Store
from app.window.main_window import MainWindow
from tests.app.test_layout_dashboard import clipped

data = tempfile.mkdtemp()
win = MainWindow(Store.open(data), state_path=data + "/state.ini")
win.show()
pane = win.new_chat()

def settle():
    for _ in range(8):
        app.processEvents()

def cut(tag):
    out = []
    for w in win.findChildren(QLabel) + win.findChildren(QAbstractButton):
        if not w.isVisible() or w.window() is not win:
            continue
        hint = w.sizeHint()
        if isinstance(w, QLabel) and w.wordWrap():
            if w.height() < w.heightForWidth(w.width()):
                out.append([tag, "wrapped label short of its lines", w.text()[:40], w.height(), w.heightForWidth(w.width())])
            continue
        if isinstance(w, QLabel) and not w.text():
            continue
        if isinstance(w, QToolButton) and w.toolButtonStyle() == Qt.ToolButtonStyle.ToolButtonIconOnly:
            if not w.toolTip() and not isinstance(w.parentWidget(), QTabBar):  # a tab bar's arrows are Qt's
                out.append([tag, "icon button without a tooltip", w.objectName()])
            continue
        shown = w.shown() if hasattr(w, "shown") else w.text()
        if shown.endswith("…") and w.text() != shown and w.text() in (w.toolTip() + w.accessibleName()):
            continue  # elided on purpose, the whole text a hover away
        if w.width() < hint.width() or w.height() < hint.height():
            out.append([tag, type(w).__name__, w.text()[:40], w.width(), w.height(), hint.width(), hint.height()])
    for bar in win.findChildren(QTabBar):
        if bar.isVisible() and bar.window() is win:
            for i in range(bar.count()):
                if bar.tabRect(i).width() < bar.tabSizeHint(i).width() or "…" in bar.tabText(i):
                    out.append([tag, "tab", bar.tabText(i), bar.tabRect(i).width(), bar.tabSizeHint(i).width()])
    return out

settle()
em = QFontMetrics(app.font()).averageCharWidth()
report = {"screen": [win.screen().geometry().width(), win.screen().geometry().height()],
          "dpr": win.devicePixelRatio(), "window": [win.width(), win.height()],
          "collapsed": {s: r.collapsed for s, r in win.rails.sides.items()},
          "em": em, "cut": cut("first start"), "composer": [pane.prompt.width() / em]}
win.rails.choose("right", "open")  # the user opens the engine panels anyway
settle()
for dock in win.findChildren(QDockWidget):
    dock.raise_()
    settle()
    report["cut"] += cut(dock.objectName())
win.dashboard.raise_()
settle()
report["dashboard"] = {k: str(v) for k, v in clipped(win.dashboard).items()}
report["composer"].append(pane.prompt.width() / em)
win.status.show_model({"name": "SmolLM2-135M-Instruct.Q4_1.gguf", "device": "cpu", "dtype": "float32",
                       "weights": "packed", "memory_bytes": 452 * 2**20, "pages": 32})
win.status.message("Loaded SmolLM2-135M-Instruct.Q4_1.gguf in 10.8 s")
settle()
bar = win.statusBar()
report["status"] = [bar.fontMetrics().horizontalAdvance(bar.currentMessage()), win.status.model_status.x()]
print(json.dumps(report))
"""


def _child(tmp_path, scale: float) -> dict:
    config = tmp_path / "screen.json"
    config.write_text(json.dumps({"screens": [{"name": "test", "x": 0, "y": 0, "width": 2732, "height": 1536,
                                               "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "QT_QPA_PLATFORM": f"offscreen:configfile={config}",
           "QT_SCALE_FACTOR": "2"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(scale)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_fonts_at_200_percent_clip_nothing(tmp_path):
    r = _child(tmp_path, 2.0)
    assert r["screen"] == [1366, 768] and r["dpr"] == 2.0  # logical 1366x768 drawn at 2x
    assert r["window"][0] <= 1366 and r["window"][1] <= 768
    assert r["collapsed"] == {"left": False, "right": True}  # the engine panels give way to their rail
    assert r["cut"] == []
    assert r["dashboard"] == {}
    assert min(r["composer"]) >= 36  # the message box keeps room for a sentence, panels open or not
    shown, label_at = r["status"]
    assert shown < label_at  # the status message ends (elided) before the model's label starts

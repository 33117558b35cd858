"""Every dock panel lays out inside its dock on 1280x720 and 1366x768 screens (no horizontal scrollbar, no
clipped buttons or columns), and chat pane headers in three tiles show each button whole or as an icon with
a tooltip, the title elided with the whole title in its tooltip.

Each screen size runs in a child process whose offscreen Qt platform has exactly that screen, as
tests/app/test_screen_fit.py does, so the window sizes itself and its docks as on first start.
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
import json, tempfile
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QDockWidget, QScrollArea, QTabBar
from app.core.store import Store
from app.window.main_window import MainWindow

app = QApplication([])
data = tempfile.mkdtemp()
win = MainWindow(Store.open(data), state_path=data + "/state.ini")
win.show()
win.new_chat()

def settle():
    for _ in range(5):
        app.processEvents()

settle()
docks = {}
for dock in win.findChildren(QDockWidget):
    dock.raise_()
    settle()
    area = dock.widget()
    inner = area.widget() if isinstance(area, QScrollArea) else area
    room = area.viewport().width() if isinstance(area, QScrollArea) else area.width()
    docks[dock.objectName()] = {"room": room, "minimum": inner.minimumSizeHint().width(),
                                "hscroll": isinstance(area, QScrollArea) and area.horizontalScrollBar().isVisible(),
                                "inner_hscroll": [type(a).__name__ for a in inner.findChildren(QAbstractScrollArea)
                                                  if a.isVisible() and a.horizontalScrollBar().isVisible()]}
tabs = [[(bar.tabText(i), bar.tabRect(i).width(), bar.tabSizeHint(i).width()) for i in range(bar.count())]
        for bar in win.findChildren(QTabBar) if bar.parent() is win and bar.isVisible()]
title = "a long chat title: the first 48 characters of a message, and more"
panes = [win.new_chat(title) for _ in range(2)]
win.chats.set_view("tiles", 3)
for pane in win.chats.panes.values():
    win.store.rename_chat(pane.session.chat_id, title)
    win.chats.renamed(pane.session.chat_id, title)
settle()
headers = []
for pane in [p for p in win.chats.panes.values() if p.isVisible()]:
    buttons = [{"text": b.text(), "width": b.width(), "hint": b.sizeHint().width(), "tooltip": b.toolTip(),
                "icon_only": b.toolButtonStyle() == Qt.ToolButtonStyle.ToolButtonIconOnly, "has_icon": not b.icon().isNull()}
               for b in pane.header_buttons.buttons]
    headers.append({"width": pane.width(), "title": pane.title.text(), "title_tip": pane.title.toolTip(),
                    "buttons": buttons})
win.chats.set_view("tabs")
settle()
pane = next(p for p in win.chats.panes.values() if p.isVisible())
wide = [b.toolButtonStyle() == Qt.ToolButtonStyle.ToolButtonIconOnly for b in pane.header_buttons.buttons]
print(json.dumps({"docks": docks, "tabs": tabs, "headers": headers, "wide_icon_only": wide}))
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
def test_panels_fit_their_docks_and_headers_never_truncate(tmp_path, width, height):
    r = _child(tmp_path, width, height)
    assert {"Model", "LoRA", "Server", "Discover", "DashboardDock"} <= set(r["docks"])
    for name, d in r["docks"].items():
        assert d["minimum"] <= d["room"], (name, d)  # laid out within the dock's width
        assert not d["hscroll"] and not d["inner_hscroll"], (name, d)  # lists and tables fit too
    (right_column,) = [t for t in r["tabs"] if len(t) == 6]  # dashboard, Model, LoRA, Discover, Server, Batch
    for text, shown, whole in right_column:
        assert shown >= whole, (text, right_column)  # every dock tab's title shown whole
    assert len(r["headers"]) == 3
    for h in r["headers"]:
        assert h["title_tip"] == h["title"] and h["title"].startswith("a long chat title")
        for b in h["buttons"]:
            if b["icon_only"]:  # an icon that says what it does
                assert b["has_icon"] and b["tooltip"], b
            else:  # or its whole text
                assert b["width"] >= b["hint"], b
    if width == 1366:
        assert any(b["icon_only"] for h in r["headers"] for b in h["buttons"])  # three tiles are narrow there
    assert r["wide_icon_only"] == [False, False, False]  # one wide pane shows the buttons' words

"""The mouse wheel over a value widget in a scrolling panel scrolls the panel unless the widget has the focus
(app.panels.wheel_guard): scrolling the Model panel past its KV cache box changed the cache's format.

Qt propagates only a real (spontaneous) wheel event to the parents, which a test cannot make offscreen, so the
tests check what decides it: the unfocused widget keeps its value and leaves the event unaccepted (Qt then
offers it to the scroll area), and a focused one takes it as before."""
import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QComboBox, QDockWidget

from tests.app.support import make_window, store  # noqa: F401

pytestmark = pytest.mark.timeout(120)


def wheel(widget, notches: int = -1) -> bool:
    """One wheel turn over the widget's centre (negative: towards the user); whether it was accepted."""
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(0, 0),
                        QPoint(0, 120 * notches), Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier,
                        Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)
    return event.isAccepted()


def value(w):
    return w.currentIndex() if isinstance(w, QComboBox) else w.value()


def test_every_value_widget_in_the_docks_passes_the_wheel_on_until_focused(qtbot, store):
    window = make_window(qtbot, store)
    docks = window.findChildren(QDockWidget)
    widgets = [w for d in docks for t in (QComboBox, QAbstractSpinBox) for w in d.findChildren(t)]
    assert any(w is window.model_panel.kv_combo for w in widgets)
    assert any(w.accessibleName().startswith("Scale of") for w in widgets)  # the LoRA table's rows, added later
    for w in widgets:
        if not w.isEnabled() or (isinstance(w, QComboBox) and w.count() < 2):
            continue
        before = value(w)
        assert not wheel(w) and value(w) == before, f"{type(w).__name__} {w.accessibleName()!r} took the wheel"
    kv = window.model_panel.kv_combo
    kv.setFocus()
    qtbot.waitUntil(kv.hasFocus)
    before = kv.currentIndex()
    wheel(kv)
    assert kv.currentIndex() == before + 1  # focused, it takes the wheel as ever


def test_the_scroll_bars_keep_the_wheel(qtbot, store):
    window = make_window(qtbot, store)
    window.resize(900, 420)  # short: the Model panel's dock scrolls
    dock = window.model_panel.parentWidget()
    while not isinstance(dock, QDockWidget):
        dock = dock.parentWidget()
    dock.raise_()
    qtbot.waitUntil(lambda: dock.widget().verticalScrollBar().maximum() > 0)
    bar = dock.widget().verticalScrollBar()
    assert not bar.hasFocus()
    wheel(bar)
    assert bar.value() > 0

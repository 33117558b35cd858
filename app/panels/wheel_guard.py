"""Value widgets inside something that scrolls take the mouse wheel only once they have the focus.

Qt hands a combo box, spin box or slider every wheel event over it, so scrolling a panel (the Model panel in
its dock, a table of adapters) with the pointer passing over one changed its value without a click: the KV
cache's format, an adapter's scale. Guarded, an unfocused one passes the wheel on to what scrolls around it, as
a browser's form fields and LM Studio's settings do; a click or Tab gives it the focus (and the wheel) again.
Scroll bars keep the wheel: they are the scrolling.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QComboBox, QScrollBar, QWidget

_VALUE_WIDGETS = (QComboBox, QAbstractSpinBox, QAbstractSlider)


class _WheelGuard(QObject):
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            event.ignore()  # filtered here, and Qt offers the unaccepted event to the parents: the scroll area
            return True
        return False


_guard: _WheelGuard | None = None


def guard_wheel(root: QWidget) -> None:
    """Guard `root` and every value widget inside it now (call it again for widgets added later)."""
    global _guard
    if _guard is None:
        _guard = _WheelGuard()
    for w in [root, *root.findChildren(QWidget)]:
        if isinstance(w, _VALUE_WIDGETS) and not isinstance(w, QScrollBar):
            w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # the wheel no longer gives focus (WheelFocus)
            w.installEventFilter(_guard)

"""The GIL shared between the Qt thread and the generator thread: how long a Qt callback may wait for it.

The generator thread runs a step as many short torch ops, each releasing the GIL and taking it back at
once. A Qt-thread callback that wants the GIL then (every Python slot, event filter, paintEvent or
sizeHint override; a repaint of the dashboard's plots makes dozens) loses the race to the generator
thread and waits for CPython's switch interval (5 ms by default) before the generator is made to drop
it: one repaint could wait several intervals. A 1 ms interval bounds each of those waits to 1 ms; the
generator thread gives the GIL up more often only while the Qt thread asks for it.
"""
from __future__ import annotations

import sys

UI_SWITCH_INTERVAL_S = 0.001


def share_gil_with_ui() -> None:
    """Lower the interpreter's switch interval to UI_SWITCH_INTERVAL_S (never raise a lower one)."""
    if sys.getswitchinterval() > UI_SWITCH_INTERVAL_S:
        sys.setswitchinterval(UI_SWITCH_INTERVAL_S)

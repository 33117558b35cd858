"""The app's engine shares the GIL with the Qt thread on a short switch interval: a Qt callback that finds the
generator thread holding the GIL (it takes it back after every torch op) waits at most that long, not
CPython's default 5 ms, once per callback (a dashboard repaint makes dozens)."""
from __future__ import annotations

import sys

import pytest


@pytest.fixture
def switch_interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_the_engine_service_lowers_the_switch_interval(qapp, switch_interval):
    from app.local.engine_service import EngineService
    from app.local.gil_share import UI_SWITCH_INTERVAL_S

    sys.setswitchinterval(0.005)  # CPython's default
    service = EngineService()
    try:
        assert sys.getswitchinterval() == pytest.approx(UI_SWITCH_INTERVAL_S, rel=0.01)
        assert UI_SWITCH_INTERVAL_S <= 0.001
    finally:
        service.deleteLater()


def test_a_lower_interval_is_kept(switch_interval):
    from app.local.gil_share import share_gil_with_ui

    sys.setswitchinterval(0.0002)
    share_gil_with_ui()
    assert sys.getswitchinterval() == pytest.approx(0.0002, rel=0.01)

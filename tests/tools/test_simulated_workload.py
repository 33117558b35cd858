"""tools.simulated_workload and tools.screenshots.readme: the simulation is shaped like generator.metrics(), and
the dashboard screenshot it feeds draws something."""
import numpy as np

from engine.contract import METRICS_KEYS
from tools.simulated_workload import SimulatedWorkload


def test_simulated_dashboard_screenshot(tmp_path, qtbot):
    from PySide6.QtGui import QImage

    from tools.screenshots.readme import save_dashboard_screenshot

    path = save_dashboard_screenshot(tmp_path / "dash.png", seconds=4.0, size=(400, 700))
    image = QImage(str(path))
    assert image.width() == 400 and image.height() == 700
    colours = {image.pixel(x, y) for x in range(0, 400, 7) for y in range(0, 700, 7)}
    assert len(colours) > 10  # something was drawn, not a blank widget


def test_simulated_workload_is_shaped_like_metrics():
    work = SimulatedWorkload(pages_total=64, seed=3)
    shared_seen = False
    for _ in range(300):
        s = work.step(0.1)
        assert set(METRICS_KEYS) == set(s)
        states = np.array(s["page_states"])
        assert s["pages_free"] == (states == -2).sum() and s["pages_cached"] == (states == -1).sum()
        assert s["pages_referenced"] + s["pages_cached"] + s["pages_free"] == s["pages_total"]
        shared = np.array(s["page_shared"])
        assert (states[shared] >= 0).all()  # only live pages can be shared
        shared_seen |= bool(shared.any())
        assert set(states[states >= 0]) <= set(s["page_owner_identifiers"])
    assert shared_seen and s["tokens_generated_total"] > 0

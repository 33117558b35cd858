"""A first start says what it is doing: compiling the CPU kernels (once per machine, ~1 min), then loading the
model, in the status bar and on the terminal, while the window keeps handling events; `python -m
kernels.cpu_ext` builds them ahead (make setup runs it)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.local.model_build import COMPILING, LOADING
from engine import envs
from tests.app.support import TINY_CACHE_TOKENS, loop, make_window, run, store, tiny_model  # noqa: F401

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import asyncio, json, sys, tempfile
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from app.core.store import Store
from app.window.event_loop import QtEventLoop
from app.window.main_window import MainWindow

app = QApplication([])
loop = QtEventLoop(app)
asyncio.set_event_loop(loop)
data = tempfile.mkdtemp()
win = MainWindow(Store.open(data), state_path=data + "/state.ini")
win.show()
seen, ticks = [], {}
win.service.load_stage.connect(lambda text: seen.append(win.status.model_status.text()))
timer = QTimer(interval=100)  # the window's event loop keeps turning during the compile
timer.timeout.connect(lambda: ticks.__setitem__(seen[-1] if seen else "", ticks.get(seen[-1] if seen else "", 0) + 1))
timer.start()
ok = loop.run_until_complete(win.loader.load_model({"path": sys.argv[1], "cache_tokens": 4096}))
print(json.dumps({"stages": seen, "ticks": ticks, "ok": ok, "message": win.statusBar().currentMessage()}))
loop.run_until_complete(win.service.close())
"""


def test_load_reports_its_stage_in_the_status_bar(qtbot, loop, store, tiny_model):  # noqa: F811
    """With the kernels built (the usual start) the window says "Loading model…", then what was loaded."""
    import engine

    async def body():
        built = engine.cpu_kernels_built()
        win = make_window(qtbot, store)
        seen = []
        win.service.load_stage.connect(lambda _t: seen.append(win.status.model_status.text()))
        assert await win.loader.load_model({"path": str(tiny_model), "cache_tokens": TINY_CACHE_TOKENS})
        assert seen == ([] if built else [COMPILING]) + [LOADING]
        assert win.model_panel.progress.format() == f"{LOADING} %p%"  # the Model tab's bar said it too
        assert win.statusBar().currentMessage().startswith("Loaded ")
        await win.service.close()

    run(loop, body())


def test_prebuild_command_reports_the_kernels_built():
    out = subprocess.run([sys.executable, "-m", "kernels.cpu_ext"], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "already built" in out.stdout or "done in" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not envs.PAGEDECK_TEST_FIRST_START,
                    reason="a real kernel compile (~2 min on 2 cores): `make test-first-start` runs it")
def test_first_start_shows_the_compile_then_the_load(tiny_model, tmp_path):  # noqa: F811
    """An empty torch extension cache (a new machine): the status bar reads COMPILING, then LOADING, the window's
    timer keeps ticking meanwhile, and the terminal is told. (A real compile: ~1 min on 2 cores.)"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "QT_QPA_PLATFORM": "offscreen",
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "empty"), "PAGEDECK_SETTINGS": str(tmp_path / "p.ini")}
    out = subprocess.run([sys.executable, "-c", CHILD, str(tiny_model)], capture_output=True, text=True,
                         timeout=840, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["stages"] == [COMPILING, LOADING]
    assert result["ticks"].get(COMPILING, 0) > 10  # > 1 s of compile with the event loop turning
    assert result["message"].startswith("Loaded ")
    assert f"pagedeck: {COMPILING}" in out.stderr
    assert list((tmp_path / "empty").glob("pagedeck_cpu_*/pagedeck_cpu_*.so"))

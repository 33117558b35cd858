"""`pagedeck ps` finds a running desktop app the way the app finds its history (the user data folder,
platformdirs): a real app process (offscreen) writes its status file there while it runs, ps shows its
model, memory, pages and running chats and requests, and once the app is terminated (SIGTERM: it shuts
down as when its window closes) the file is gone and ps says no app runs. A file left by a process that
has ended reads as no app."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.core.running_app import STATUS_FILE, read_running
from tests.cli.support import REPO, cli_env, data_dir, pagedeck
from tests.cli.test_cli_serve_ps import TEMPLATE
from tests.scripted_models import write_scripted_model

pytestmark = pytest.mark.timeout(400)


def test_ps_shows_the_running_app_and_forgets_it_when_it_ends(tmp_path):
    folder = write_scripted_model(tmp_path / "m", ["hello"], TEMPLATE)
    env = cli_env(tmp_path, own_home=False, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "config"))
    app = subprocess.Popen([sys.executable, "-m", "app", "--model", str(folder), "--cache-tokens", "1024"],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    status_file = data_dir(env) / STATUS_FILE
    try:
        deadline = time.monotonic() + 300  # a deadline for start-up and the model's load, not a measurement
        while not (read_running(data_dir(env)) or {}).get("models"):
            assert app.poll() is None, app.stderr.read()
            assert time.monotonic() < deadline, "the app never reported a loaded model"
            time.sleep(0.5)
        r = pagedeck(["ps", "--json"], env)  # no --data-dir: the user data folder, as the app's
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)["app"]
        assert got["pid"] == app.pid and got["server"] is None and got["chats_running"] == 0
        (model,) = got["models"]
        assert model["main"] and model["path"] == str(folder) and model["memory_bytes"] > 0
        assert model["pages_total"] == 1024 // 256 and model["pages_used"] == 0 and model["chats_running"] == 0
        table = pagedeck(["ps"], env)
        assert table.returncode == 0, table.stderr
        assert f"pagedeck app (pid {app.pid})" in table.stdout and f"{model['name']} (main)" in table.stdout
        assert "0/4" in table.stdout and "chats running: 0 · requests running: 0" in table.stdout
    finally:
        app.send_signal(signal.SIGTERM)
        try:
            rc = app.wait(60)
        except subprocess.TimeoutExpired:
            app.kill()
            raise
    assert rc == 0, app.stderr.read()
    assert not status_file.exists()  # removed at exit
    gone = pagedeck(["ps", "--data-dir", str(data_dir(env))], env)
    assert "pagedeck app" not in gone.stdout
    if gone.returncode:  # (a server of someone else's may answer at the default address)
        assert f"no pagedeck app is running with the data folder {data_dir(env)}" in gone.stderr

    ended = subprocess.Popen(["true"])
    ended.wait()
    status_file.write_text(json.dumps({"pid": ended.pid, "models": []}))  # as a killed app leaves it
    assert read_running(data_dir(env)) is None
    stale = pagedeck(["ps", "--json", "--data-dir", str(data_dir(env))], env)
    assert "app" not in (json.loads(stale.stdout) if stale.returncode == 0 else {})


def test_ps_with_a_url_asks_that_server_only(tmp_path):
    """--url: the app's status file is not read (a script asking one server gets that server or an error)."""
    env = cli_env(tmp_path, own_home=False)
    folder = data_dir(env)
    folder.mkdir(parents=True)
    (folder / STATUS_FILE).write_text(json.dumps({"pid": os.getpid(), "models": [], "chats_running": 0,
                                                  "requests_running": 0, "server": None}))
    assert read_running(folder)["pid"] == os.getpid()  # this process is alive: the file reads as an app
    r = pagedeck(["ps", "--url", "http://127.0.0.1:9"], env)
    assert r.returncode == 1 and "no server answers at http://127.0.0.1:9" in r.stderr and not r.stdout
    assert Path(folder / STATUS_FILE).exists()

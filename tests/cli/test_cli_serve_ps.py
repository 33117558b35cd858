"""`pagedeck serve` is the engine's server (every flag passed through), and `pagedeck ps` reads what it holds
from its /v1/models and /metrics; with no server it says so in one line."""
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.cli.support import REPO, cli_env, pagedeck
from tests.scripted_models import write_scripted_model

pytestmark = pytest.mark.timeout(300)
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_then_ps_shows_the_served_model(tmp_path):
    folder = write_scripted_model(tmp_path / "m", ["hello"], TEMPLATE)
    env = cli_env(tmp_path, own_home=False)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "app", "serve", "--model", str(folder), "--port", str(port),
                               "--cache-tokens", "1024", "--served-model-name", "tiny-served"],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240  # a deadline for start-up, not a measurement
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.5)
        r = pagedeck(["ps", "--url", url, "--json"], env)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert "tiny-served" in [m["id"] for m in got["models"]]
        assert "vllm:num_requests_running" in got["metrics"]
        table = pagedeck(["ps", "--url", url], env)
        assert table.returncode == 0 and "tiny-served" in table.stdout and "requests running: 0" in table.stdout
    finally:
        server.terminate()
        server.wait(30)
    gone = pagedeck(["ps", "--url", url], env)
    assert gone.returncode == 1 and f"no server answers at {url}" in gone.stderr

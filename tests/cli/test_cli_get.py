"""`pagedeck get` against a local Hub server (tools.peers.fake_hub, loopback; HF_ENDPOINT points at it): the
quantization chosen by name or by the preferred fitting one, a progress bar, a connection cut mid-file
resumed by Range, a corrupt file refused by its hash; then `ls` sees the download and `rm -y` deletes it."""
import hashlib
import json
from pathlib import Path

import pytest

from tests.cli.support import cli_env, pagedeck
from tools.peers.fake_hub import COMMIT, FakeHub

pytestmark = pytest.mark.timeout(300)
REPO_ID = "tester/Tiny-Llama-GGUF"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tiny_llama_folder) -> bytes:
    from tests.tiny_models import write_tiny_gguf

    return write_tiny_gguf(tiny_llama_folder, tmp_path_factory.mktemp("hubfiles") / "t.gguf", "Q8_0").read_bytes()


@pytest.fixture
def hub(tiny_gguf):
    server = FakeHub({REPO_ID: {"tiny-llama-Q8_0.gguf": tiny_gguf, "tiny-llama-F16.gguf": tiny_gguf + b"",
                                "README.md": b"# tiny"}}).start()
    yield server
    server.stop()


def _env(tmp_path, hub):
    return cli_env(tmp_path, HF_ENDPOINT=hub.url)


def test_get_picks_the_preferred_quant_and_ls_and_rm_see_it(tmp_path, hub, tiny_gguf):
    env = _env(tmp_path, hub)
    r = pagedeck(["get", REPO_ID], env)
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path == tmp_path / "hub" / "models--tester--Tiny-Llama-GGUF" / "snapshots" / COMMIT / "tiny-llama-Q8_0.gguf"
    assert path.read_bytes() == tiny_gguf
    assert "pulling tester/Tiny-Llama-GGUF/tiny-llama-Q8_0.gguf (Q8_0)" in r.stderr and "100%" in r.stderr
    assert [q for q in hub.requests if "/resolve/" in q[1]] == [("GET", f"/{REPO_ID}/resolve/{COMMIT}/tiny-llama-Q8_0.gguf",
                                                              None)]
    listed = json.loads(pagedeck(["ls", "--json"], env).stdout)
    assert [m["name"] for m in listed] == [f"{REPO_ID}/tiny-llama-Q8_0.gguf"]

    refused = pagedeck(["rm", "Q8_0"], env, stdin="")
    assert refused.returncode == 1 and "-y" in refused.stderr and path.exists()
    gone = pagedeck(["rm", "-y", "tiny-llama-Q8_0"], env)
    assert gone.returncode == 0, gone.stderr
    assert not path.exists() and json.loads(pagedeck(["ls", "--json"], env).stdout) == []


def test_get_by_quant_name_and_by_file(tmp_path, hub):
    env = _env(tmp_path, hub)
    r = pagedeck(["get", REPO_ID, "--quant", "f16"], env)
    assert r.returncode == 0, r.stderr and r.stdout.strip().endswith("tiny-llama-F16.gguf")
    missing = pagedeck(["get", REPO_ID, "--quant", "Q2_K"], env)
    assert missing.returncode == 1 and "no Q2_K file" in missing.stderr and "tiny-llama-F16.gguf (F16)" in missing.stderr
    nope = pagedeck(["get", "tester/nope"], env)
    assert nope.returncode == 1 and "no such repository (404)" in nope.stderr
    by_file = pagedeck(["get", f"{REPO_ID}/tiny-llama-F16.gguf"], env)  # already there: nothing fetched again
    assert by_file.returncode == 0 and sum("/resolve/" in q[1] for q in hub.requests) == 1


def test_a_cut_connection_is_resumed_by_range(tmp_path, hub, tiny_gguf):
    cut = len(tiny_gguf) // 3
    hub.cut_after["tiny-llama-Q8_0.gguf"] = cut
    r = pagedeck(["get", REPO_ID, "--quant", "Q8_0"], _env(tmp_path, hub))
    assert r.returncode == 0, r.stderr
    assert "resuming after" in r.stderr
    ranges = [q[2] for q in hub.requests if "/resolve/" in q[1]]
    assert ranges == [None, f"bytes={cut}-"]  # the rest only, not the file again
    assert hashlib.sha256(Path(r.stdout.strip()).read_bytes()).hexdigest() == hashlib.sha256(tiny_gguf).hexdigest()


def test_a_corrupt_file_is_refused_and_not_loadable(tmp_path, hub):
    hub.corrupt.add("tiny-llama-Q8_0.gguf")
    env = _env(tmp_path, hub)
    r = pagedeck(["get", REPO_ID, "--quant", "Q8_0"], env)
    assert r.returncode == 1 and "failed its hash check" in r.stderr and "deleted" in r.stderr
    assert sum("/resolve/" in q[1] for q in hub.requests) == 1  # refused, not fetched again and again
    assert json.loads(pagedeck(["ls", "--json"], env).stdout) == []
    assert not list((tmp_path / "hub").rglob("*.incomplete"))

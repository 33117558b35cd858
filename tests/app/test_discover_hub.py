"""Discover's Qt-free half against a local Hub server (tools.peers.fake_hub, loopback): search, file listing with
quantization/size/fit, a download interrupted and resumed, a hash mismatch refused, a full disk, a 404, cancel.
Nothing reaches the internet: every call goes to the server the test started.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.discover.download import CANCELLED, DONE, FAILED, PAUSED, DownloadJob
from app.discover.hub import Hub, HubError, quant_of
from tools.peers.fake_hub import COMMIT, FakeHub

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
GGUF_NAME = "tiny-llama-Q8_0.gguf"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> bytes:
    from tests.tiny_models import write_tiny_gguf, write_tiny_model

    tmp = tmp_path_factory.mktemp("hubfiles")
    folder = write_tiny_model(tmp / "hf")
    return write_tiny_gguf(folder, tmp / GGUF_NAME, "Q8_0").read_bytes()


@pytest.fixture
def hub(tiny_gguf, tiny_llama_folder):
    hf_files = {p.name: p.read_bytes() for p in tiny_llama_folder.iterdir() if p.is_file()}
    server = FakeHub({"tester/Tiny-Llama-GGUF": {GGUF_NAME: tiny_gguf, "tiny-llama-F16.gguf": tiny_gguf,
                                                   "mmproj-tiny-F16.gguf": b"x" * 10, "README.md": b"# tiny"},
                      "tester/tiny-llama": hf_files,
                      "other/unrelated-text": {"notes.txt": b"hello"}}).start()
    yield server
    server.stop()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    hub_dir = tmp_path / "hfcache"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_dir))
    return hub_dir


def test_quant_labels_from_file_names():
    assert quant_of("Qwen2.5-7B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("model.IQ4_XS.gguf") == "IQ4_XS"
    assert quant_of("llama-3.2-1b-instruct-q8_0.gguf") == "Q8_0"
    assert quant_of("phi-4-BF16.gguf") == "BF16"
    assert quant_of("model.gguf") == ""


def test_search_lists_files_with_quant_size_and_fit(hub):
    api = Hub(endpoint=hub.url, token=False)
    repos = api.search("tiny")
    assert [r.repo_id for r in repos] == ["tester/Tiny-Llama-GGUF", "tester/tiny-llama"]  # most downloads first
    assert repos[0].kinds == ["gguf"] and repos[1].kinds == ["hf"]
    models = api.files("tester/Tiny-Llama-GGUF")
    assert [(m.name, m.quant, m.kind) for m in models] == [(GGUF_NAME, "Q8_0", "gguf"),
                                                           ("tiny-llama-F16.gguf", "F16", "gguf")]  # no mmproj
    m = models[0]
    assert m.size == len(hub.repos["tester/Tiny-Llama-GGUF"][GGUF_NAME]) and m.revision == COMMIT
    assert len(m.blobs[0].sha256) == 64
    assert m.estimate is not None and m.estimate.weights_bytes == m.size and m.fits is True  # tiny: fits anywhere
    (folder,) = api.files("tester/tiny-llama")
    assert folder.kind == "hf" and {"config.json", "model.safetensors"} <= {b.name for b in folder.blobs}
    assert folder.estimate.weights_bytes == 2 * folder.size  # widened to float32 on a CPU


def test_unknown_repo_is_a_clear_404(hub):
    with pytest.raises(HubError, match=r"tester/nope.*no such repository \(404\)"):
        Hub(endpoint=hub.url, token=False).files("tester/nope")


@pytest.mark.parametrize("endpoint, why", [
    ("http://127.0.0.1:9", r"cannot reach 127\.0\.0\.1: no network, or a proxy or firewall in the way \(.*refused"),
    ("http://no-such-host.invalid", r"cannot reach no-such-host\.invalid: no network")])
def test_an_unreachable_hub_is_named_as_such(endpoint, why):
    """A closed port and a name that resolves nowhere (what a machine offline sees): the host and the likely
    cause, not a bare exception class."""
    with pytest.raises(HubError, match=r"Could not list the files of tester/x: " + why):
        Hub(endpoint=endpoint, token=False).files("tester/x")


def test_search_offline_fails_at_once_without_the_hub_clients_retries(caplog):
    """huggingface_hub retries a failed connection five times with growing waits (~23 s offline); the search
    says the host cannot be reached before any of that (no retry logged)."""
    caplog.set_level("WARNING")
    with pytest.raises(HubError, match=r"Searching the Hub at http://127.0.0.1:9 failed: cannot reach 127\.0\.0\.1"):
        Hub(endpoint="http://127.0.0.1:9", token=False).search("qwen")
    assert not [r for r in caplog.records if "Retry" in r.getMessage()]


def test_behind_a_proxy_the_reachability_check_stands_aside(monkeypatch):
    """Through a proxy the Hub's host may not be reachable directly; the proxy's client decides then."""
    from app.discover.hub import Unreachable, check_reachable

    with pytest.raises(Unreachable):
        check_reachable("http://no-such-host.invalid")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:3128")
    monkeypatch.setenv("no_proxy", "")
    check_reachable("http://no-such-host.invalid")
    monkeypatch.setenv("no_proxy", "no-such-host.invalid")
    with pytest.raises(Unreachable):
        check_reachable("http://no-such-host.invalid")


def test_missing_file_is_a_clear_404(hub, cache):
    (m,) = [m for m in Hub(endpoint=hub.url, token=False).files("tester/Tiny-Llama-GGUF") if m.quant == "F16"]
    del hub.repos["tester/Tiny-Llama-GGUF"]["tiny-llama-F16.gguf"]  # gone between listing and download
    job = DownloadJob(m, cache, hub.url)
    job.start()
    assert job.wait(30) and job.state == FAILED
    assert "no such file in the repository (404)" in job.error
    assert not job.path.exists()


def test_interrupted_download_resumes_and_discovery_finds_it(hub, cache):
    import engine

    (m, _) = Hub(endpoint=hub.url, token=False).files("tester/Tiny-Llama-GGUF")
    data = hub.repos["tester/Tiny-Llama-GGUF"][GGUF_NAME]
    hub.cut_after[GGUF_NAME] = len(data) // 3  # the connection drops a third of the way in
    job = DownloadJob(m, cache, hub.url)
    job.start()
    assert job.wait(30) and job.state == FAILED and job.error  # said, not hidden
    partial = cache / "models--tester--Tiny-Llama-GGUF" / "blobs" / (m.blobs[0].sha256 + ".incomplete")
    assert partial.stat().st_size == len(data) // 3 == job.done_bytes
    job.resume()
    assert job.wait(30) and job.state == DONE, job.error
    assert ("GET", f"/tester/Tiny-Llama-GGUF/resolve/{COMMIT}/{GGUF_NAME}", f"bytes={len(data) // 3}-") in hub.requests
    assert job.path.read_bytes() == data and job.path.is_symlink() and not partial.exists()
    found = {f.name: f for f in engine.find_models(env={"HF_HUB_CACHE": str(cache)}, home=cache / "home")}
    hit = found[f"tester/Tiny-Llama-GGUF/{GGUF_NAME}"]
    assert hit.path == job.path and hit.supported and hit.info.quant == "Q8_0"


def test_hf_folder_download_is_found_as_a_folder(hub, cache):
    import engine

    (m,) = Hub(endpoint=hub.url, token=False).files("tester/tiny-llama")
    job = DownloadJob(m, cache, hub.url)
    job.start()
    assert job.wait(30) and job.state == DONE, job.error
    found = {f.name: f for f in engine.find_models(env={"HF_HUB_CACHE": str(cache)}, home=cache / "home")}
    assert found["tester/tiny-llama"].path == job.path and found["tester/tiny-llama"].supported


def test_hash_mismatch_is_refused_and_nothing_loadable_left(hub, cache):
    import engine

    (m, _) = Hub(endpoint=hub.url, token=False).files("tester/Tiny-Llama-GGUF")
    hub.corrupt.add(GGUF_NAME)
    job = DownloadJob(m, cache, hub.url)
    job.start()
    assert job.wait(30) and job.state == FAILED
    assert "failed its hash check" in job.error and "deleted" in job.error
    assert not job.path.exists() and not list((cache / "models--tester--Tiny-Llama-GGUF" / "blobs").iterdir())
    assert engine.find_models(env={"HF_HUB_CACHE": str(cache)}, home=cache / "home") == []


def test_cancel_removes_the_partial_file(hub, cache):
    (m, _) = Hub(endpoint=hub.url, token=False).files("tester/Tiny-Llama-GGUF")
    hub.cut_after[GGUF_NAME] = 1000
    job = DownloadJob(m, cache, hub.url)
    job.start()
    assert job.wait(30) and job.state == FAILED
    blobs = cache / "models--tester--Tiny-Llama-GGUF" / "blobs"
    assert [p.name.endswith(".incomplete") for p in blobs.iterdir()] == [True]
    job.cancel()
    assert job.state == CANCELLED and list(blobs.iterdir()) == [] and job.done_bytes == 0


def test_pause_keeps_the_partial_file_for_resume(hub, cache):
    (m, _) = Hub(endpoint=hub.url, token=False).files("tester/Tiny-Llama-GGUF")
    job = DownloadJob(m, cache, hub.url)
    job._stop = PAUSED  # asked before the first chunk is written: the worker stops at its first check
    job.state = "running"
    job._run()
    assert job.state == PAUSED and job.wait(0)
    job.resume()
    assert job.wait(30) and job.state == DONE and job.path.read_bytes() == hub.repos["tester/Tiny-Llama-GGUF"][GGUF_NAME]


def test_the_token_is_sent_but_never_shown_or_logged(hub, cache, caplog):
    import logging

    token = "hf_" + "S3cretTokenValue" * 2
    caplog.set_level(logging.DEBUG)
    api = Hub(endpoint=hub.url, token=token)
    (m, _) = api.files("tester/Tiny-Llama-GGUF")
    del hub.repos["tester/Tiny-Llama-GGUF"][GGUF_NAME]
    job = DownloadJob(m, cache, api.endpoint, token)
    job.start()
    assert job.wait(30) and job.state == FAILED
    with pytest.raises(HubError) as failed:
        api.files("tester/private")
    assert f"Bearer {token}" in hub.authorizations  # it was used
    shown = job.error + str(failed.value) + caplog.text
    assert token not in shown and "S3cretTokenValue" not in shown


DISK_CHILD = r"""
import sys
from app.discover.download import DownloadJob
from app.discover.hub import Hub
url, cache, mode = sys.argv[1:4]
m = Hub(endpoint=url, token=False).files("tester/Tiny-Llama-GGUF")[0]
if mode == "enospc":  # the space check passes (the hub says the file is small), the disk fills while writing
    m.blobs[0] = type(m.blobs[0])(m.blobs[0].name, 100, m.blobs[0].sha256)
job = DownloadJob(m, cache, url)
job.start()
job.wait(60)
print(job.state, "|", job.error)
"""


@pytest.mark.parametrize("mode", ["check", "enospc"])
def test_full_disk_is_reported(hub, tmp_path, mode):
    """A real 1 MiB tmpfs (mounted in a user namespace, no root needed) as the cache: the space check refuses
    a bigger download up front, and a disk that fills while writing is reported as full."""
    mount = tmp_path / "small"
    mount.mkdir()
    script = (f"mount -t tmpfs -o size=64k tmpfs {mount} && "
              f"exec {sys.executable} -c \"$CHILD\" {hub.url} {mount}/hub {mode}")
    try:
        out = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(REPO), "CHILD": DISK_CHILD}, cwd=REPO)
    except FileNotFoundError:
        pytest.skip("unshare is not installed")
    if out.returncode != 0 and "mount" in out.stderr:
        pytest.skip(f"user namespaces unavailable here: {out.stderr.strip()}")
    state, error = out.stdout.strip().split(" | ")
    assert state == "failed", out.stderr
    if mode == "check":
        assert error.startswith("Not enough disk space in") and "needs" in error
    else:
        assert error.startswith("The disk is full") and "Resume" in error

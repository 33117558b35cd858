"""The Discover view (real widgets) against a local Hub server: search, pick a file, download with progress,
then Load offered, and the main window loading the download through the Model tab."""
import threading
import time

import pytest
from PySide6.QtCore import Qt

from app.discover.discover_view import DiscoverView
from app.discover.download import CANCELLED, DONE, PAUSED, RUNNING
from app.discover.hub import Hub
from tests.app.support import loop, make_window, run, store, wait_until  # noqa: F401
from tools.peers.fake_hub import FakeHub

pytestmark = pytest.mark.timeout(120)
NAME = "tiny-llama-Q8_0.gguf"


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    from tests.tiny_models import write_tiny_gguf, write_tiny_model

    tmp = tmp_path_factory.mktemp("viewfiles")
    return write_tiny_gguf(write_tiny_model(tmp / "hf"), tmp / NAME, "Q8_0").read_bytes()


class HeldHub(FakeHub):
    """The local Hub server, sending each file a little at a time and holding back its last RESERVE bytes
    (one byte every PACE_S) until `release` is set: a download stays mid-way however slow the machine, and
    bytes keep coming, so the client (which looks for a pause or a cancel between chunks) notices either."""

    PACE_BYTES, PACE_S, RESERVE = 16384, 0.01, 65536

    def __init__(self, repos):
        super().__init__(repos)
        self.release = threading.Event()
        held, base = self, self.server.RequestHandlerClass

        class Handler(base):
            def _file(self, repo_id, name):
                self.wfile = _PacedWriter(self.wfile, held)
                try:
                    super()._file(repo_id, name)
                except (BrokenPipeError, ConnectionResetError):  # the client paused or cancelled
                    self.close_connection = True

        self.server.RequestHandlerClass = Handler

    def stop(self) -> None:
        self.release.set()
        super().stop()


class _PacedWriter:
    """A response's writer at HeldHub's pace: headers (small) at once, a body in PACE_BYTES pieces."""

    def __init__(self, raw, hub: HeldHub):
        self.raw, self.hub = raw, hub

    def write(self, data: bytes) -> None:
        hub, at = self.hub, 0
        if len(data) <= hub.PACE_BYTES:  # headers
            return self.raw.write(data)
        while at < len(data):
            left = len(data) - at
            if hub.release.is_set():
                n = left
            elif left > hub.RESERVE:
                n = min(hub.PACE_BYTES, left - hub.RESERVE)
            elif left > 1:
                n = 1  # the body's tail: a byte a beat, the last one only once released
            else:
                hub.release.wait()
                continue
            self.raw.write(data[at:at + n])
            self.raw.flush()
            at += n
            if at < len(data):
                time.sleep(hub.PACE_S)

    def flush(self) -> None:
        self.raw.flush()


@pytest.fixture
def held_hub(gguf_bytes):
    server = HeldHub({"tester/Tiny-Llama-GGUF": {NAME: gguf_bytes}, "tester/Tiny-Other-GGUF": {"x-Q4_K_M.gguf": b"GGUF"}})
    server.start()
    yield server
    server.stop()


@pytest.fixture
def hub(gguf_bytes):
    server = FakeHub({"tester/Tiny-Llama-GGUF": {NAME: gguf_bytes}, "tester/Tiny-Other-GGUF": {"x-Q4_K_M.gguf": b"GGUF"}})
    server.start()
    yield server
    server.stop()


def _search_and_pick(qtbot, view: DiscoverView, query: str) -> None:
    view.query.setText(query)
    qtbot.mouseClick(view.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.repo_list.topLevelItemCount() == 2, timeout=10000)
    view.repo_list.setCurrentItem(view.repo_list.topLevelItem(0))
    qtbot.waitUntil(lambda: view.file_list.topLevelItemCount() == 1, timeout=10000)
    view.file_list.setCurrentItem(view.file_list.topLevelItem(0))


def test_search_download_progress_and_load(qtbot, hub, tmp_path):
    view = DiscoverView(Hub(endpoint=hub.url, token=False), cache_dir=tmp_path / "hub")
    qtbot.addWidget(view)
    view.show()
    assert not view.download_button.isEnabled() and not view.load_button.isEnabled()  # nothing picked yet
    _search_and_pick(qtbot, view, "tiny")
    row = view.file_list.topLevelItem(0)
    assert [row.text(c) for c in range(4)] == [NAME, "Q8_0", f"{len(hub.repos['tester/Tiny-Llama-GGUF'][NAME]) / 2**20:.1f} MiB", "yes"]
    assert "Needs at least" in row.toolTip(3)

    hub.cut_after[NAME] = 300_000  # the first attempt drops: the view says so and offers Resume
    seen = []
    view._timer.timeout.connect(lambda: seen.append(view.progress.value()))
    qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.download_button.text() == "Resume", timeout=20000)
    assert "failed" in view.progress_label.text() and view.progress.value() > 0
    assert view.cancel_button.isEnabled() and not view.load_button.isEnabled()
    downloaded = []
    view.downloaded.connect(downloaded.append)
    qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.load_button.isEnabled(), timeout=20000)
    assert view.progress.value() == 1000 and "Downloaded and verified" in view.progress_label.text()
    assert view.job().state == DONE and downloaded == [str(view.job().path)]
    assert not view.download_button.isEnabled()
    with qtbot.waitSignal(view.load_requested, timeout=2000) as got:
        qtbot.mouseClick(view.load_button, Qt.MouseButton.LeftButton)
    assert got.args == [str(view.job().path)] and view.job().path.read_bytes() == hub.repos["tester/Tiny-Llama-GGUF"][NAME]


def test_pause_resume_and_cancel_mid_download_from_the_buttons(qtbot, held_hub, tmp_path):
    """The server holds the file's end back, so each click lands while the file is still coming."""
    view = DiscoverView(Hub(endpoint=held_hub.url, token=False), cache_dir=tmp_path / "hub")
    qtbot.addWidget(view)
    _search_and_pick(qtbot, view, "tiny")
    qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    job = view.job()
    qtbot.waitUntil(lambda: job.done_bytes > 0, timeout=20000)
    assert job.state == RUNNING and view.download_button.text() == "Pause"
    qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    assert job.wait(20) and job.state == PAUSED
    qtbot.waitUntil(lambda: view.download_button.text() == "Resume", timeout=5000)
    paused_at = job.done_bytes
    assert 0 < paused_at < job.total_bytes and "Paused at" in view.progress_label.text()
    (partial,) = (tmp_path / "hub").rglob("*.incomplete")
    assert partial.stat().st_size == paused_at  # every byte received is kept

    qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: job.done_bytes > paused_at, timeout=20000)
    assert job.state == RUNNING and view.download_button.text() == "Pause"
    assert ("GET", f"/tester/Tiny-Llama-GGUF/resolve/{job.model.revision}/{NAME}", f"bytes={paused_at}-") \
        in held_hub.requests  # the resume asked for the rest only

    qtbot.mouseClick(view.cancel_button, Qt.MouseButton.LeftButton)
    assert view.job() is None
    assert job.wait(20) and job.state == CANCELLED
    assert not list((tmp_path / "hub").rglob("*.incomplete")) and not job.path.exists()


def test_unknown_repository_is_reported_in_the_view(qtbot, hub, tmp_path):
    view = DiscoverView(Hub(endpoint=hub.url, token=False), cache_dir=tmp_path / "hub")
    qtbot.addWidget(view)
    view._ask("files", view.hub.files, "tester/gone")
    qtbot.waitUntil(lambda: "404" in view.status.text(), timeout=10000)
    assert "tester/gone" in view.status.text()


def test_load_from_discover_loads_the_download_in_the_window(qtbot, loop, store, hub, tmp_path):  # noqa: F811
    """The main window's Discover dock: download, Load, and the chats run on the downloaded model (through the
    Model tab, which shows it), and the Model tab's list of models on disk finds it in the cache."""
    async def body():
        win = make_window(qtbot, store)
        view = win.discover
        view._hub, view._cache_dir = Hub(endpoint=hub.url, token=False), tmp_path / "hub"
        _search_and_pick(qtbot, view, "tiny")
        view.download_button.click()
        await wait_until(lambda: view.load_button.isEnabled(), 30, "the download")
        path = str(view.job().path)
        view.load_button.click()
        await wait_until(lambda: win.service.info is not None and not win.service.loading, 60, "the load")
        assert win.service.info["path"] == path and win.model_panel.path_edit.text() == path
        assert win.statusBar().currentMessage().startswith("Loaded ")
        await win.service.close()

    run(loop, body())


def test_progress_text_gives_amount_speed_and_time_left(hub, tmp_path):
    from app.discover.discover_view import progress_text
    from app.discover.download import DownloadJob

    (m,) = Hub(endpoint=hub.url, token=False).files("tester/Tiny-Llama-GGUF", estimate=False)
    job = DownloadJob(m, tmp_path / "hub", hub.url)
    job.state, job.done_bytes, job.speed, job.total_bytes = RUNNING, 1 << 20, float(1 << 19), 3 << 20
    assert progress_text(job) == "Downloading: 1.0 MiB of 3.0 MiB · 512.0 KiB/s · 4 s left"
    job.total_bytes = (1 << 20) + 150 * (1 << 19)
    assert progress_text(job).endswith("· 2 min 30 s left")

"""The Discover view: search the Hugging Face Hub, pick a file (quantization, size, whether it fits this machine),
download it into the Hugging Face cache with progress, speed and ETA, pause, resume or cancel, then Load.

A view of app.discover.hub and app.discover.download: Hub calls run on a worker thread and come back through
signals; downloads run on their own threads and a timer repaints their progress, so the window stays
responsive. Nothing is fetched until the user searches. A finished download emits `load_requested(path)`
(the window loads it with the Model tab's options) and `downloaded(path)` (the Model tab rescans).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QHBoxLayout, QHeaderView, QLabel, QLineEdit, QProgressBar, QPushButton, QTreeWidget, QTreeWidgetItem,
    QVBoxLayout, QWidget,
)

from app.core.formatting import human_bytes
from app.discover.download import DONE, FAILED, PAUSED, RUNNING, DownloadJob
from app.discover.hub import Hub, HubModel, HubRepo

_GREY, _BAD = QColor("#8a8a8a"), QColor("#d0342c")
REPO_COLUMNS = ("Repository", "Type", "Downloads")
FILE_COLUMNS = ("File", "Quant", "Size", "Fits")


def _table(columns: tuple[str, ...]) -> QTreeWidget:
    """A list whose first column takes the room left and elides, the others sized to their contents: it
    never asks for more width than the dock has."""
    tree = QTreeWidget()
    tree.setHeaderLabels(list(columns))
    tree.setRootIsDecorated(False)
    tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)
    tree.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    header = tree.header()
    header.setStretchLastSection(False)
    header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    for col in range(1, len(columns)):
        header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
    header.setMinimumSectionSize(24)
    return tree


def fit_text(model: HubModel) -> tuple[str, str]:
    """The Fits column and its tooltip, from the engine's estimate of the download."""
    est = model.estimate
    if model.problem:
        return "—", f"Not supported: {model.problem}"
    if est is None or est.fits is None:
        return "?", "Free memory is unknown on this machine."
    free = human_bytes(est.available_bytes)
    need = human_bytes(est.total_bytes)
    why = (f"Needs at least ~{need} of {free} free: the weights ({est.weights}) and the runtime; the KV cache "
           "comes on top (the Model tab shows the full estimate once the file is on disk).")
    return ("yes" if est.fits else "no"), why


class DiscoverView(QWidget):
    load_requested = Signal(str)  # a finished download's path, to load
    downloaded = Signal(str)  # a download finished (the model list rescans)
    _answered = Signal(str, object, object)  # (what, result, error) from the Hub worker thread

    def __init__(self, hub: Hub | None = None, cache_dir=None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._hub, self._cache_dir = hub, cache_dir
        self.repos: list[HubRepo] = []
        self.models: list[HubModel] = []
        self.jobs: dict[tuple[str, str], DownloadJob] = {}  # (repo, file) -> its download
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hub")

        self.query = QLineEdit()
        self.query.setPlaceholderText("Search the Hugging Face Hub (e.g. qwen2.5 gguf)")
        self.query.setClearButtonEnabled(True)
        self.query.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        self.repo_list = _table(REPO_COLUMNS)
        self.repo_list.currentItemChanged.connect(self._repo_chosen)
        self.file_list = _table(FILE_COLUMNS)
        self.file_list.currentItemChanged.connect(lambda *_: self._refresh())
        self.status = QLabel("Search for a model: GGUF files and Hugging Face folders pagedeck can run.")
        self.status.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress_label = QLabel()
        self.progress_label.setWordWrap(True)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.download_or_pause)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.load_button = QPushButton("Load")
        self.load_button.clicked.connect(self._load)

        search = QHBoxLayout()
        search.addWidget(self.query, 1)
        search.addWidget(self.search_button)
        actions = QHBoxLayout()
        for b in (self.download_button, self.cancel_button, self.load_button):
            actions.addWidget(b)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(search)
        layout.addWidget(self.repo_list, 2)
        layout.addWidget(self.file_list, 2)
        layout.addWidget(self.status)
        layout.addWidget(self.progress)
        layout.addWidget(self.progress_label)
        layout.addLayout(actions)
        self._answered.connect(self._answer)
        self._timer = QTimer(self, interval=250)
        self._timer.timeout.connect(self._refresh)
        self._refresh()

    @property
    def hub(self) -> Hub:
        if self._hub is None:  # made on first use: HfApi reads HF_ENDPOINT and the token then
            self._hub = Hub()
        return self._hub

    def cache_dir(self):
        if self._cache_dir is None:
            from app.discover.hub import hub_cache_dir

            return hub_cache_dir()
        return self._cache_dir

    # ----------------------------------------------------------------------------- Hub calls
    def _ask(self, what: str, call, *args) -> None:
        def work():
            try:
                self._answered.emit(what, call(*args), None)
            except Exception as exc:  # shown in the view, never lost
                self._answered.emit(what, None, exc)

        self._pool.submit(work)

    def search(self) -> None:
        self.search_button.setEnabled(False)
        self.status.setText("Searching…")
        self._ask("search", self.hub.search, self.query.text())

    def _repo_chosen(self, item: QTreeWidgetItem | None, _previous=None) -> None:
        if item is None:
            return
        repo = item.text(0)
        self.file_list.clear()
        self.status.setText(f"Listing the files of {repo}…")
        self._ask("files", self.hub.files, repo)

    def _answer(self, what: str, result, error) -> None:
        self.search_button.setEnabled(True)
        if error is not None:
            self.status.setText(str(error))
            return
        if what == "search":
            self.repos = result
            self.repo_list.clear()
            for r in result:
                item = QTreeWidgetItem([r.repo_id, " + ".join(k.upper() for k in r.kinds) or "?", f"{r.downloads:,}"])
                item.setToolTip(0, r.repo_id)
                self.repo_list.addTopLevelItem(item)
            self.status.setText(f"{len(result)} repositories with GGUF or safetensors models." if result else
                                "Nothing found: try other words (a model family, a size, 'gguf').")
        else:
            self.models = result
            self.file_list.clear()
            for m in result:
                self.file_list.addTopLevelItem(self._file_row(m))
            files = f"{len(result)} loadable file{'s' if len(result) != 1 else ''}"
            self.status.setText(f"{files}; pick one to download." if result else
                                "No GGUF file or safetensors folder pagedeck can load in this repository.")
        self._refresh()

    def _file_row(self, m: HubModel) -> QTreeWidgetItem:
        fits, why = fit_text(m)
        label = m.name if m.kind == "gguf" else f"{m.name} (HF folder, {len(m.blobs)} files)"
        item = QTreeWidgetItem([label, m.quant or "?", human_bytes(m.size), fits])
        item.setToolTip(0, f"{m.repo_id}/{m.name}")
        item.setToolTip(3, why)
        if m.problem:
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled)
            for col in range(len(FILE_COLUMNS)):
                item.setForeground(col, _GREY)
                item.setToolTip(col, why)
        elif fits == "no":
            item.setForeground(3, _BAD)
        return item

    # ----------------------------------------------------------------------------- downloads
    def selected(self) -> HubModel | None:
        item = self.file_list.currentItem()
        if item is None:
            return None
        i = self.file_list.indexOfTopLevelItem(item)
        return self.models[i] if 0 <= i < len(self.models) else None

    def job(self) -> DownloadJob | None:
        m = self.selected()
        return None if m is None else self.jobs.get((m.repo_id, m.name))

    def download_or_pause(self) -> None:
        """Download the selected file; on a running download, pause it; on a paused or failed one, resume."""
        m, job = self.selected(), self.job()
        if m is None or m.problem:
            return
        if job is None:
            job = self.jobs[(m.repo_id, m.name)] = DownloadJob(m, self.cache_dir(), self.hub.endpoint, self.hub.token)
        if job.state == RUNNING:
            job.pause()
        elif job.state != DONE:
            job.start()
        self._timer.start()
        self._refresh()

    def cancel(self) -> None:
        job = self.job()
        if job is not None and job.state != DONE:
            job.cancel()
            del self.jobs[(job.model.repo_id, job.model.name)]
            self._refresh()

    def _load(self) -> None:
        job = self.job()
        if job is not None and job.state == DONE:
            self.load_requested.emit(str(job.path))

    def _refresh(self) -> None:
        """Buttons, progress bar and label for the selected file's download; stops the timer when idle."""
        job, m = self.job(), self.selected()
        state = job.state if job is not None else None
        self.download_button.setEnabled(m is not None and not m.problem and state != DONE)
        self.download_button.setText({RUNNING: "Pause", PAUSED: "Resume", FAILED: "Resume"}.get(state, "Download"))
        self.cancel_button.setEnabled(state in (RUNNING, PAUSED, FAILED))
        self.load_button.setEnabled(state == DONE)
        self.progress.setVisible(job is not None)
        if job is not None:
            self.progress.setValue(int(1000 * job.done_bytes / max(job.total_bytes, 1)))
            self.progress_label.setText(progress_text(job))
            self.progress_label.setToolTip(str(job.path))
        else:
            self.progress_label.setText("")
        for j in list(self.jobs.values()):
            if j.state == DONE and not getattr(j, "announced", False):
                j.announced = True
                self.downloaded.emit(str(j.path))
        if not any(j.state == RUNNING for j in self.jobs.values()):
            self._timer.stop()

    def closeEvent(self, event) -> None:
        for j in self.jobs.values():
            j.pause()
        self._pool.shutdown(wait=False, cancel_futures=True)
        super().closeEvent(event)


def progress_text(job: DownloadJob) -> str:
    """"12.0 MB of 80.0 MB · 4.5 MB/s · 15 s left", or the state and its reason."""
    amount = f"{human_bytes(job.done_bytes)} of {human_bytes(job.total_bytes)}"
    if job.state == RUNNING:
        eta = job.eta
        rate = f" · {human_bytes(job.speed)}/s" if job.speed else ""
        left = "" if eta is None else f" · {_duration(eta)} left"
        return f"Downloading: {amount}{rate}{left}"
    if job.state == DONE:
        return f"Downloaded and verified ({human_bytes(job.total_bytes)}): ready to load."
    if job.state == PAUSED:
        return f"Paused at {amount}."
    if job.state == FAILED:
        return job.error
    return ""


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600} h {s % 3600 // 60} min" if s >= 3600 else f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"

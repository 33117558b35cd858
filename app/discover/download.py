"""Downloading a Hub model into the Hugging Face cache, on a worker thread: progress, speed and ETA, pause,
resume, cancel, and a hash check before anything is loadable.

The cache layout is huggingface_hub's own (models--org--name/blobs/<hash>, snapshots/<commit>/<file> as a
relative link to the blob, refs/main), so `huggingface-cli`, transformers and pagedeck's discovery
(engine.find_models) all see the download. A file is written to blobs/<hash>.incomplete, the name
huggingface_hub also resumes from; a pause or a dropped connection keeps it and Resume asks for the rest
with an HTTP Range. A finished file is hashed (sha256 for LFS files, the git blob id for small files)
against the Hub's metadata before it is renamed into place: a mismatch deletes it and fails the job, so a
corrupt file never becomes a loadable model. Free space is checked before writing, and a disk that fills
anyway (ENOSPC) fails the job saying so, the partial file kept for a resume.
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
import time
from pathlib import Path

from app.core.formatting import human_bytes
from app.discover.hub import HubBlob, HubModel, describe_error

QUEUED, RUNNING, PAUSED, DONE, FAILED, CANCELLED = "queued", "running", "paused", "done", "failed", "cancelled"
CHUNK = 1 << 20


class _Stop(Exception):
    """The worker was asked to pause or cancel."""


class DownloadJob:
    """One model's download. start() runs it on a thread; the view reads state, done_bytes, speed, eta and
    error (plain attributes, written by the worker). `path` is what to load once the state is DONE."""

    def __init__(self, model: HubModel, cache_dir: str | Path, endpoint: str, token: str | bool | None = None):
        self.model, self.endpoint, self.token = model, endpoint.rstrip("/"), token
        self.repo_dir = Path(cache_dir) / ("models--" + model.repo_id.replace("/", "--"))
        self.state, self.error = QUEUED, ""
        self.total_bytes = model.size
        self.done_bytes = 0
        self.speed = 0.0  # bytes/s, smoothed
        self._thread: threading.Thread | None = None
        self._stop: str | None = None  # PAUSED or CANCELLED, asked by the UI thread
        self._finished = threading.Event()
        self.done_bytes = sum(self._have(b) for b in model.blobs)

    # ------------------------------------------------------------------------------- control (UI thread)
    @property
    def path(self) -> Path:
        """The snapshot path pagedeck loads: the GGUF file, or the snapshot folder of an HF model."""
        snap = self.repo_dir / "snapshots" / self.model.revision
        return snap / self.model.name if self.model.kind == "gguf" else snap

    @property
    def eta(self) -> float | None:
        left = self.total_bytes - self.done_bytes
        return left / self.speed if self.speed > 0 and self.state == RUNNING else None

    def start(self) -> None:
        """Start, or resume after a pause or a failure (what is on disk is kept and not fetched again)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop, self.error, self.state = None, "", RUNNING
        self._finished.clear()
        self._thread = threading.Thread(target=self._run, name=f"download {self.model.name}", daemon=True)
        self._thread.start()

    resume = start

    def pause(self) -> None:
        if self.state == RUNNING:
            self._stop = PAUSED

    def cancel(self) -> None:
        """Stop and delete the partial files (finished blobs of other files are kept: they are valid)."""
        if self._thread is not None and self._thread.is_alive():
            self._stop = CANCELLED
        else:
            self._remove_partials()
            self.state = CANCELLED
            self._finished.set()

    def wait(self, timeout: float) -> bool:
        """Block until the job stops (done, failed, paused, cancelled); False on timeout. For tests and tools."""
        return self._finished.wait(timeout)

    # ------------------------------------------------------------------------------- the worker
    def _run(self) -> None:
        try:
            self._check_space()
            for blob in self.model.blobs:
                self._fetch(blob)
            self._link_snapshot()
            self.state = DONE
        except _Stop:
            if self._stop == CANCELLED:
                self._remove_partials()
            self.state = self._stop
        except Exception as exc:  # a network, Hub or disk error: the partial file stays for Resume
            self.state, self.error = FAILED, self._describe(exc)
        finally:
            self.speed = 0.0
            self._finished.set()

    def _blob_path(self, blob: HubBlob) -> Path:
        return self.repo_dir / "blobs" / (blob.sha256 or blob.git_sha1 or blob.name.replace("/", "_"))

    def _have(self, blob: HubBlob) -> int:
        final = self._blob_path(blob)
        if final.is_file():
            return final.stat().st_size
        part = final.with_name(final.name + ".incomplete")
        return part.stat().st_size if part.is_file() else 0

    def _check_space(self) -> None:
        left = self.total_bytes - self.done_bytes
        folder = self.repo_dir
        while not folder.exists():
            folder = folder.parent
        free = shutil.disk_usage(folder).free
        if free < left:
            raise DownloadError(f"Not enough disk space in {folder}: the download needs {human_bytes(left)} more, "
                                f"{human_bytes(free)} is free")

    def _fetch(self, blob: HubBlob) -> None:
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        final = self._blob_path(blob)
        if final.is_file() and final.stat().st_size == blob.size:
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        part = final.with_name(final.name + ".incomplete")
        have = part.stat().st_size if part.is_file() else 0
        if have > blob.size:
            part.unlink()
            have = 0
        if have < blob.size:
            headers = build_hf_headers(token=self.token)
            if have:
                headers["Range"] = f"bytes={have}-"
            url = hf_hub_url(self.model.repo_id, blob.name, revision=self.model.revision, endpoint=self.endpoint)
            with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=30) as r:
                if r.status_code == 416 and have:  # nothing left to send: verify what is there
                    pass
                else:
                    hf_raise_for_status(r)
                    if have and r.status_code != 206:  # the server ignored the range: start over
                        self.done_bytes -= have
                        have = 0
                    self._write(r, part, "ab" if have else "wb")
        self._verify(blob, part)
        os.replace(part, final)

    def _write(self, response, part: Path, mode: str) -> None:
        last_t, last_n = time.monotonic(), self.done_bytes
        with open(part, mode) as f:
            for chunk in response.iter_bytes():  # as received: a dropped connection keeps every byte
                if self._stop:
                    raise _Stop
                f.write(chunk)
                self.done_bytes += len(chunk)
                now = time.monotonic()
                if now - last_t >= 0.25:
                    rate = (self.done_bytes - last_n) / (now - last_t)
                    self.speed = rate if self.speed == 0 else 0.7 * self.speed + 0.3 * rate
                    last_t, last_n = now, self.done_bytes

    def _verify(self, blob: HubBlob, part: Path) -> None:
        """Hash the whole file against the Hub's metadata; a mismatch deletes it (never loadable)."""
        size = part.stat().st_size
        if blob.sha256:
            h = hashlib.sha256()
        elif blob.git_sha1:
            h = hashlib.sha1(b"blob %d\0" % size)
        else:
            return
        with open(part, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        want = blob.sha256 or blob.git_sha1
        if size != blob.size or h.hexdigest() != want:
            part.unlink()
            self.done_bytes -= size
            raise DownloadError(f"{blob.name} failed its hash check (expected {'sha256' if blob.sha256 else 'git sha1'}"
                                f" {want[:12]}…, got {h.hexdigest()[:12]}…, {size} of {blob.size} bytes); "
                                "the file was deleted")

    def _link_snapshot(self) -> None:
        """snapshots/<commit>/<file> -> ../../blobs/<hash> (relative, as huggingface_hub writes it), refs/main."""
        snap = self.repo_dir / "snapshots" / self.model.revision
        for blob in self.model.blobs:
            link = snap / blob.name
            link.parent.mkdir(parents=True, exist_ok=True)
            target = os.path.relpath(self._blob_path(blob), link.parent)
            if link.is_symlink() or link.exists():
                link.unlink()
            try:
                link.symlink_to(target)
            except OSError:  # no symlinks (some Windows setups): a copy, as huggingface_hub falls back to
                shutil.copyfile(self._blob_path(blob), link)
        refs = self.repo_dir / "refs"
        refs.mkdir(exist_ok=True)
        (refs / "main").write_text(self.model.revision)

    def _remove_partials(self) -> None:
        for blob in self.model.blobs:
            final = self._blob_path(blob)
            part = final.with_name(final.name + ".incomplete")
            if part.is_file():
                self.done_bytes -= part.stat().st_size
                part.unlink()
        self.done_bytes = max(self.done_bytes, 0)

    def _describe(self, exc: Exception) -> str:
        from huggingface_hub.errors import HfHubHTTPError

        if isinstance(exc, DownloadError):
            return str(exc)
        if not isinstance(exc, OSError) or isinstance(exc, HfHubHTTPError) or exc.errno is None:
            return f"Downloading {self.model.name} failed: {describe_error(exc)}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return (f"The disk is full: writing {self.repo_dir} stopped at {human_bytes(self.done_bytes)} of "
                    f"{human_bytes(self.total_bytes)}. Free some space and press Resume (the partial file is kept).")
        return f"Could not write the download: {exc}"


class DownloadError(Exception):
    """A download failed for a reason stated in words (disk space, hash check)."""


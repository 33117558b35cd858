"""InstanceLock: one pagedeck per data folder, so two processes never write the same history.

An exclusive fcntl lock (flock) on `pagedeck.lock` in the data folder, held by an open file for the
process's life. The kernel drops it when the process ends however it ends (kill -9 included), so a
lock can never be stale: the file left behind by a killed process is simply locked again. The file
holds the owner's pid, only to name it in the refusal message.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "pagedeck.lock"


class AlreadyRunning(RuntimeError):
    """Another live process holds the data folder."""


class InstanceLock:
    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> "InstanceLock":
        """Take the lock or raise AlreadyRunning naming the folder and the other process."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(f"pagedeck is already running with the data folder {self.path.parent} "
                                 f"(process {owner}); use that window, or start this one with another "
                                 f"--data-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

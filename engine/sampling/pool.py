"""The sampling thread pool: per-job sampling of one step spread over worker threads.

numpy and torch release the GIL in their kernels, so several jobs' samplers overlap on real cores.
Below `min_threads` jobs the hand-off costs more than it saves, so they run inline (ExLlamaV2's rule).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, TypeVar

T = TypeVar("T")


class SamplingPool:
    """Runs a step's sampling callables; `busy_last` is how many distinct threads ran them last call."""

    def __init__(self, max_threads: int = 16, min_threads: int = 3) -> None:
        for name, v in (("max_threads", max_threads), ("min_threads", min_threads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.max_threads = max_threads
        self.min_threads = min_threads
        self.busy_last = 0
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, fns: list[Callable[[], T]]) -> list[T]:
        """Results in the order of `fns`. Every callable has finished when this returns, even if one
        raised (the first exception in order is re-raised), so no job is left mid-sample."""
        if not fns:
            self.busy_last = 0
            return []
        if self.max_threads == 1 or len(fns) < self.min_threads:
            self.busy_last = 1
            return [fn() for fn in fns]
        threads: set[int] = set()

        def tracked(fn: Callable[[], T]) -> T:
            threads.add(threading.get_ident())
            return fn()

        futures = [self._pool().submit(tracked, fn) for fn in fns]
        wait(futures)
        self.busy_last = len(threads)
        return [f.result() for f in futures]

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_threads, thread_name_prefix="pagedeck-sampling")
            return self._executor

    def shutdown(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def __enter__(self) -> SamplingPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

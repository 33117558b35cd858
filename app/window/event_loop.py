"""The app's asyncio loop on the Qt thread (qasync), closed so that none of its Qt objects outlives it.

qasync keeps a loop's timers in one parentless QObject: every call_later (asyncio.sleep, wait_for's
timeout, a save timer) starts a Qt timer there, and a cancelled handle's Qt timer stays registered until
it would have fired. A closed loop with such a timer is a reference cycle (timer -> handle -> loop ->
timer), so Python's cycle collector frees it later, on whichever thread happens to allocate at that
moment: the generator's worker, a sampling or filter pool thread. ~QObject cannot unregister timers from
another thread ("QObject::~QObject: Timers cannot be stopped from another thread"), the GUI thread's event
dispatcher keeps the freed object's address, and when the timer is due it delivers a QTimerEvent into freed
memory: the test suite's intermittent segfault inside pytest-qt's event processing,
and a crash at exit for the app. close() here deletes that object at once, on the thread that owns it,
and the default executor is a plain thread pool (qasync's makes ten QThreads per loop).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import qasync
import shiboken6


class QtEventLoop(qasync.QEventLoop):
    """qasync.QEventLoop whose close() leaves no Qt timer or thread behind."""

    def __init__(self, app=None):
        super().__init__(app)
        self._thread = threading.get_ident()
        self.set_default_executor(ThreadPoolExecutor(thread_name_prefix="pagedeck-loop"))

    def close(self) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError("close the event loop on the thread that created it (the Qt GUI thread)")
        closing = not self.is_closed()
        super().close()  # shuts the executor down (waits for its threads)
        timer = getattr(self, "_timer", None)  # qasync's _SimpleTimer: the QObject owning every pending timer
        if closing and timer is not None and shiboken6.isValid(timer):
            shiboken6.delete(timer)  # unregisters its pending timers here, on the GUI thread

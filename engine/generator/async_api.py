"""DynamicGeneratorAsync / DynamicJobAsync: the generator loop on one worker thread, results to asyncio.

ExLlamaV2's async wrapper runs iterate() on the event loop itself, which freezes a Qt UI (qasync) for
every forward pass and never wakes a consumer whose job was cancelled. Here one dedicated worker
thread owns the sync generator: it sleeps on a condition while idle, runs iterate() while jobs
remain, and hands each step's results to the jobs' event loops with call_soon_threadsafe.

Thread rule: the sync generator is not thread-safe (only metrics() is), so every other call into it
(enqueue, cancel, set_loras, load_lora, unload_lora, iterate) runs on the worker thread. Callers on the
event loop post commands that the worker runs between steps, so the loop never waits for a forward pass;
reading an adapter's files happens in the loop's executor, off both.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from types import MappingProxyType
from typing import Any, Callable

from ..contract.adapters import AdapterSnapshot
from ..model.lora import LoRA
from .generator import DynamicGenerator
from .job import DynamicJob


class _Failure:
    """An exception travelling through a job's queue, re-raised by the consumer."""

    def __init__(self, exc: BaseException):
        self.exc = exc


def _post(loop: asyncio.AbstractEventLoop, fn: Callable, *args: Any) -> None:
    """call_soon_threadsafe that tolerates a loop closed under us (nobody is listening then)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


def _resolve(fut: asyncio.Future, result: Any = None, exc: BaseException | None = None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class DynamicGeneratorAsync:
    """Async front of DynamicGenerator. The sync generator is private to the worker thread: callers use
    this class's members, or `run_on_worker` to run a function on it between steps."""

    def __init__(self, model: Any = None, cache: Any = None, tokenizer: Any = None, **options: Any):
        self._generator = DynamicGenerator(model, cache, tokenizer, **options)
        self._adapters = AdapterSnapshot()  # replaced (never changed) by the worker after each registry change
        self._wake = threading.Condition()  # guards the fields below; never held around a step
        self._commands: deque[Callable[[], None]] = deque()
        self._deferred: list[DynamicJobAsync] = []
        self._swap: tuple[Any, Any] | None = None  # pending (loras, scales)
        self._swap_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._unload_waiters: list[tuple[Any, asyncio.AbstractEventLoop, asyncio.Future]] = []  # worker only
        self._closed = False
        self._active: dict[int, DynamicJobAsync] = {}  # id(sync job) -> wrapper; worker thread only
        self._stalled = False  # worker thread only: a failed step left jobs it could not drop
        self._worker = threading.Thread(target=self._run, name="pagedeck-generator", daemon=True)
        self._worker.start()

    # -- public ----------------------------------------------------------------------------------

    @property
    def pending_loras(self) -> tuple[Any, Any] | None:
        """(loras, scales) of a swap waiting for running jobs to finish, else None."""
        with self._wake:
            return self._swap

    @property
    def num_deferred(self) -> int:
        with self._wake:
            return len(self._deferred)

    @property
    def max_seq_len(self) -> int:
        """The most tokens one job's sequence may hold (prompt + reply); fixed for the generator's life."""
        return self._generator.max_seq_len

    def adapters(self) -> AdapterSnapshot:
        """The loaded adapters and the default set, as the worker last published them (any thread)."""
        return self._adapters

    def metrics(self) -> dict:
        """generator.metrics() (thread-safe) plus the jobs this layer holds back for a LoRA swap."""
        m = self._generator.metrics()
        m["deferred_jobs"] = self.num_deferred
        return m

    async def set_loras(self, loras: Any, scales: Any = None) -> None:
        """Swap the active LoRA set: at once when idle, else after the running jobs finish.

        Jobs created while a swap is pending are deferred and start, in order, after it. A later
        call while one is pending replaces the pending set; every caller returns when the swap is
        done and gets its exception if it failed (the deferred jobs then run with the old set).
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._wake:
            self._check_open()
            self._swap = (loras, scales)
            self._swap_waiters.append((loop, fut))
            self._commands.append(lambda: None)  # wake the worker so it swaps now if idle
            self._wake.notify()
        await fut

    async def load_lora(self, lora: Any, name: str | None = None) -> Any:
        """DynamicGenerator.load_lora without blocking the loop or the generator: the files are read in the
        loop's default executor, then registered between two steps. Returns the loaded LoRA."""
        if not isinstance(lora, LoRA):
            model = self._generator.model
            lora = await asyncio.get_running_loop().run_in_executor(None, lambda: LoRA.load(lora, model, name=name))
        return await self.run_on_worker(lambda g: g.load_lora(lora, name))

    async def unload_lora(self, lora: Any) -> None:
        """Unload an adapter; returns once it is gone. New jobs naming it are refused at once; queued and
        running jobs that use it finish first (jobs deferred for a LoRA swap are not among them: they fail
        when released if they name it)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def command() -> None:
            try:
                gone = self._generator.unload_lora(lora)
            except Exception as exc:  # noqa: BLE001 - handed to the awaiting caller
                _post(loop, _resolve, fut, None, exc)
                return
            self._publish_adapters()
            if gone:
                _post(loop, _resolve, fut)
            else:
                self._unload_waiters.append((lora, loop, fut))

        self._submit(command)
        await fut

    async def run_on_worker(self, fn: Callable[[DynamicGenerator], Any]) -> Any:
        """Run fn(generator) on the worker thread between steps (e.g. warmup, defrag_cache)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def command() -> None:
            try:
                out = fn(self._generator)
            except Exception as exc:  # noqa: BLE001 - handed to the awaiting caller
                self._publish_adapters()
                _post(loop, _resolve, fut, None, exc)
            else:
                self._publish_adapters()  # before the caller wakes: it may read adapters() next
                _post(loop, _resolve, fut, out)

        self._submit(command)
        return await fut

    async def close(self) -> None:
        """Cancel every job (consumers are woken), stop the worker and wait for it to exit."""
        with self._wake:
            if not self._closed:
                self._closed = True
                self._wake.notify()
        await asyncio.get_running_loop().run_in_executor(None, self._worker.join)

    # -- used by DynamicJobAsync (event loop side) --------------------------------------------

    def _submit(self, command: Callable[[], None]) -> None:
        with self._wake:
            self._check_open()
            self._commands.append(command)
            self._wake.notify()

    def _add_job(self, job: "DynamicJobAsync") -> None:
        """Enqueue a new job on the worker, or defer it while a LoRA swap is pending."""
        with self._wake:
            self._check_open()
            if self._swap is not None:
                self._deferred.append(job)
                job._deliver_now({"job": job.job, "serial": None, "identifier": job.identifier,
                                  "stage": "deferred", "eos": False,
                                  "pending_loras": self._swap[0]})
                return
            self._commands.append(lambda: self._enqueue(job))
            self._wake.notify()

    def _remove_job(self, job: "DynamicJobAsync", done: asyncio.Future) -> None:
        """Cancel a job wherever it is: deferred here, or queued/running in the generator."""
        loop = done.get_loop()
        with self._wake:
            if job in self._deferred:
                self._deferred.remove(job)
                _resolve(done)
                return
            if self._closed:  # the worker cancels everything on its way out
                _resolve(done)
                return
            self._commands.append(lambda: self._cancel_command(job, loop, done))
            self._wake.notify()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("DynamicGeneratorAsync is closed")

    # -- worker thread -----------------------------------------------------------------------

    def _publish_adapters(self) -> None:
        """Replace the adapter snapshot if the registry changed (worker thread; before waking a caller)."""
        registry = self._generator.adapters
        snap = AdapterSnapshot(
            MappingProxyType({name: (str(lora.path) if lora.path else None) for name, lora in registry.loaded.items()}),
            frozenset(registry.unloading),
            tuple((lora.name, float(scale)) for lora, scale in registry.default),
        )
        if snap != self._adapters:
            self._adapters = snap

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - a dead worker must not leave consumers hanging
            with self._wake:
                self._closed = True
            self._fail_active(exc)
            self._shutdown()
            raise

    def _serve(self) -> None:
        while True:
            busy = not self._stalled and self._generator.num_remaining_jobs() > 0
            with self._wake:
                while not (self._commands or self._closed or busy):
                    self._wake.wait()
                commands = list(self._commands)
                self._commands.clear()
                closed = self._closed
            if commands:
                self._stalled = False
            for command in commands:
                command()
            if closed:
                self._shutdown()
                return
            if not self._stalled and self._generator.num_remaining_jobs() > 0:
                self._step()
                self._publish_adapters()  # a step may drop adapters whose last user ended
            self._maybe_swap()
            self._finish_unloads()

    def _cancel_command(self, job: "DynamicJobAsync", loop: asyncio.AbstractEventLoop,
                        done: asyncio.Future) -> None:
        try:
            self._cancel(job)
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting cancel()
            _post(loop, _resolve, done, None, exc)
        else:
            _post(loop, _resolve, done)

    def _enqueue(self, job: "DynamicJobAsync") -> None:
        if job._cancel_requested:
            return
        try:
            job.serial = self._generator.enqueue_checked(job.job)  # checked when the job was made
        except Exception as exc:  # noqa: BLE001 - a bad job fails alone, raised by its consumer
            job._post_failure(exc)
            return
        self._active[id(job.job)] = job

    def _cancel(self, job: "DynamicJobAsync") -> None:
        if self._active.pop(id(job.job), None) is not None:
            self._generator.cancel(job.job)

    def _step(self) -> None:
        try:
            results = self._generator.iterate()
        except Exception as exc:  # noqa: BLE001 - engine failure: every waiting job hears of it
            self._fail_active(exc)
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[DynamicJobAsync, dict]]] = {}
        for r in results:
            job = self._active.get(id(r.get("job")))
            if job is None:  # cancelled meanwhile, or not ours
                continue
            if r.get("eos"):
                del self._active[id(job.job)]
            by_loop.setdefault(job._loop, []).append((job, r))
        for loop, batch in by_loop.items():  # one wake-up per loop per step
            _post(loop, _deliver_batch, batch)

    def _fail_active(self, exc: BaseException) -> None:
        """Drop the failed step's jobs from the generator so it can serve later ones."""
        victims = list(self._active.values())
        self._active.clear()
        for job in victims:
            try:
                self._generator.cancel(job.job)
            except Exception:  # noqa: BLE001 - the generator is already in trouble
                pass
            job._post_failure(exc)
        # Jobs the generator could not drop would fail every step: wait for the next command then.
        try:
            if self._generator.num_remaining_jobs() > 0:
                self._generator.clear_queue()
            self._stalled = self._generator.num_remaining_jobs() > 0
        except Exception:  # noqa: BLE001
            self._stalled = True

    def _finish_unloads(self, error: BaseException | None = None) -> None:
        """Wake unload_lora callers whose adapter is gone (or all of them with `error`)."""
        if not self._unload_waiters:
            return
        self._publish_adapters()
        loaded = self._generator.adapters.loaded
        waiting = []
        for lora, loop, fut in self._unload_waiters:
            name = lora if isinstance(lora, str) else lora.name
            if error is None and name in loaded:
                waiting.append((lora, loop, fut))
            else:
                _post(loop, _resolve, fut, None, error)
        self._unload_waiters = waiting

    def _maybe_swap(self) -> None:
        with self._wake:
            if self._swap is None or self._generator.num_remaining_jobs() > 0:
                return
            loras, scales = self._swap
            waiters = self._swap_waiters
            self._swap, self._swap_waiters = None, []
        error: BaseException | None = None
        try:
            self._generator.set_loras(loras, scales)
        except Exception as exc:  # noqa: BLE001 - handed to every awaiting set_loras caller
            error = exc
        self._publish_adapters()
        with self._wake:
            if self._swap is None:  # no newer swap asked for meanwhile: release the deferred jobs
                deferred, self._deferred = self._deferred, []
            else:
                deferred = []
        for job in deferred:
            self._enqueue(job)
        for loop, fut in waiters:
            _post(loop, _resolve, fut, None, error)

    def _shutdown(self) -> None:
        with self._wake:
            deferred, self._deferred = self._deferred, []
            waiters, self._swap_waiters = self._swap_waiters, []
            self._swap = None
            leftover = list(self._commands)
            self._commands.clear()
        for command in leftover:
            command()
        for job in list(self._active.values()) + deferred:
            try:
                self._cancel(job)
            except Exception:  # noqa: BLE001 - closing anyway; the consumer is still woken
                pass
            job._post_cancelled()
        for loop, fut in waiters:
            _post(loop, _resolve, fut, None, RuntimeError("DynamicGeneratorAsync closed before the LoRA swap"))
        self._finish_unloads()  # cancelling the jobs above let their adapters go
        self._finish_unloads(RuntimeError("DynamicGeneratorAsync closed before the LoRA adapter was unloaded"))


def _deliver_batch(batch: list[tuple["DynamicJobAsync", dict]]) -> None:
    for job, result in batch:
        job._deliver_now(result)


class DynamicJobAsync:
    """One request: created and enqueued at once; `async for result in job` streams its results.

    Arguments after the generator are DynamicJob's. A job this generator could never run (e.g. a prompt
    too long for the cache) raises here; engine failures are raised from the iteration, so a consumer
    never hangs.
    """

    def __init__(self, generator: DynamicGeneratorAsync, *args: Any, **kwargs: Any):
        self.generator = generator
        self.job = DynamicJob(*args, **kwargs)
        generator._generator.check_job(self.job)
        self.identifier = getattr(self.job, "identifier", kwargs.get("identifier"))
        self.serial: int | None = None
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._done = False        # no more results will be queued (loop thread only)
        self._exhausted = False   # the consumer has seen the end
        self._cancel_requested = False
        generator._add_job(self)

    def __aiter__(self) -> "DynamicJobAsync":
        return self

    async def __anext__(self) -> dict:
        if self._exhausted:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, _Failure):
            self._exhausted = True
            raise item.exc
        if item.get("eos"):
            self._exhausted = True
        return item

    async def cancel(self) -> None:
        """Cancel the job (its pages are freed when this returns) and end the consumer's iteration."""
        if self._cancel_requested:
            return
        self._cancel_requested = True
        finished = self._done
        self._post_cancelled_now()
        if finished:
            return
        done = self._loop.create_future()
        try:
            self.generator._remove_job(self, done)
        except RuntimeError:  # closed: nothing left to cancel
            return
        await done

    # -- delivery (these run on the job's event loop) -------------------------------------------

    def _deliver_now(self, result: dict) -> None:
        if self._done:
            return
        if result.get("eos"):
            self._done = True
        self._queue.put_nowait(result)

    def _fail_now(self, exc: BaseException) -> None:
        if not self._done:
            self._done = True
            self._queue.put_nowait(_Failure(exc))

    def _post_cancelled_now(self) -> None:
        self._deliver_now({"job": self.job, "serial": self.serial, "identifier": self.identifier,
                           "stage": "streaming", "eos": True, "eos_reason": "cancelled",
                           "text": "", "token_ids": []})

    # -- called from the worker thread ----------------------------------------------------------

    def _post_failure(self, exc: BaseException) -> None:
        _post(self._loop, self._fail_now, exc)

    def _post_cancelled(self) -> None:
        _post(self._loop, self._post_cancelled_now)

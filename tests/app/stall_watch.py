"""StallWatch: what the Qt thread was doing while the soak's stall probe was late.

A watchdog thread polls the probe's last tick every 2 ms; once the probe is more than THRESHOLD late it
records, until the probe ticks again, samples of the main thread's Python stack (sys._current_frames), the
system call it sits in (/proc/self/task/<tid>/syscall: futex = waiting for a lock, most likely the GIL;
poll = the loop idle, waiting for its timer) and, from the start of the gap to its end, every thread's time
on a CPU and waiting on the run queue (/proc/self/task/<tid>/schedstat, in ns): a gap where the main thread
ran is work on the loop (its stack says which); one where it waited on the run queue is the machine's load;
one where it slept in futex while an engine thread ran is the GIL.

Off unless PAGEDECK_SOAK_WATCH is set: polling takes the GIL every 2 ms.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time

THRESHOLD_S = 0.015
POLL_S = 0.002
SYSCALLS = {"7": "poll", "202": "futex", "271": "ppoll", "232": "epoll_wait", "281": "epoll_pwait",
            "0": "read", "1": "write", "23": "select", "270": "pselect6", "74": "fsync", "75": "fdatasync",
            "running": "running"}


def _schedstat(tid: int) -> tuple[int, int]:
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):
        return 0, 0


def _syscall(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            first = f.read().split()[0]
    except (OSError, IndexError):
        return "?"
    return SYSCALLS.get(first, first)


def _names() -> dict[int, str]:
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                out[int(t)] = f.read().strip()
        except OSError:
            pass
    for th in threading.enumerate():
        if th.native_id is not None:
            out[th.native_id] = th.name
    return out


def _all_sched() -> dict[int, tuple[int, int]]:
    return {int(t): _schedstat(int(t)) for t in os.listdir("/proc/self/task")}


def _stack(frame, depth: int = 6) -> str:
    parts = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        parts.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno}:{code.co_name}")
        frame = frame.f_back
    return " < ".join(parts)


class StallWatch:
    """Records each gap of the probe longer than THRESHOLD_S: its length, what the main thread was doing
    (stack and system call samples), CPU and run-queue time per thread over the gap, and the scripted step
    the probe counted the gap under."""

    def __init__(self, probe):
        self._probe = probe  # .last: perf_counter() of its last tick; .last_step: the step that tick counted under
        self._main = threading.main_thread()
        self._main_tid = self._main.native_id
        self.gaps: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            time.sleep(POLL_S)
            last = self._probe.last
            if time.perf_counter() - last > THRESHOLD_S:
                self._record(last)

    def _record(self, last: float) -> None:
        seen_at = time.perf_counter()
        before = _all_sched()
        stacks, calls = collections.Counter(), collections.Counter()
        polls = 0
        while self._probe.last == last and not self._stop.is_set():
            frame = sys._current_frames().get(self._main.ident)
            stacks[_stack(frame)] += 1
            calls[_syscall(self._main_tid)] += 1
            polls += 1
            time.sleep(POLL_S)
        end = time.perf_counter()
        after = _all_sched()
        names = _names()
        cpu = {}
        for tid, (on, wait) in after.items():
            on0, wait0 = before.get(tid, (on, wait))
            if on - on0 > 1_000_000 or wait - wait0 > 1_000_000 or tid == self._main_tid:
                name = "MAIN" if tid == self._main_tid else names.get(tid, str(tid))
                cpu[f"{name}/{tid}"] = (round((on - on0) / 1e6, 1), round((wait - wait0) / 1e6, 1))
        self.gaps.append({"gap_ms": round((self._probe.last - last - 0.010) * 1000, 1),
                          "watched_ms": round((end - seen_at) * 1000, 1),
                          "late_seen_ms": round((seen_at - last) * 1000, 1),
                          "label": self._probe.last_step, "stacks": stacks.most_common(3), "syscalls": dict(calls),
                          "cpu_ms_runq_ms": cpu})

    def summary(self, top: int = 15) -> dict:
        """Gaps by label and by the main thread's state, and the longest gaps in full."""
        by_label = collections.Counter(g["label"] for g in self.gaps)
        by_call = collections.Counter(max(g["syscalls"], key=g["syscalls"].get) if g["syscalls"] else "-"
                                      for g in self.gaps)
        frames = collections.Counter()
        for g in self.gaps:
            for s, n in g["stacks"]:
                frames[s] += n
        return {"gaps": len(self.gaps), "by_label": dict(by_label), "main_syscall": dict(by_call),
                "top_stacks": frames.most_common(top),
                "longest": sorted(self.gaps, key=lambda g: -g["gap_ms"])[:top]}

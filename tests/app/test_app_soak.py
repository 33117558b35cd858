"""The app for hours, scripted: many replies across 8 chats in the real window on the real default model, with
switches between tiles and tabs, regenerate, branch (and deleting the branch), a model reload and remote
connect/disconnect (a real pagedeck server on loopback), while a 10 ms QTimer probes UI stalls.

Oracles: after warm-up the number of live Qt objects and of Python wrappers of Qt objects stay flat, every
reply ends "done", no page stays referenced. `make soak-app` (PAGEDECK_SOAK_REPLIES=500) also replaces each
chat by a fresh one after 4 replies of its own (PAGEDECK_SOAK_ROTATE), so that what the chats hold stays level
and growth is a leak, not longer transcripts, and asserts: RSS (read after a trim, as the generator trims when
it drains) and the heap in use grow at most 20 MB per 1000 replies between reloads (a least-squares slope over
every sample after warm-up, each stretch between reloads at its own level) and 30 MB per reload, and the stall p99 of steady streaming is under one 60 Hz
frame (timing is a benchmark, not a `make test` check on a shared machine). Ticks whose gap saw a user action
(a switch, a new chat, a reload, a remote connect, a branch) or the meter's own object scans are counted
apart and reported, not judged; PAGEDECK_SOAK_WATCH records what the loop did in each late tick. At the end the 8 chats are deleted to measure
what they held (heap and RSS freed, against their transcripts' characters).

    make soak-app     # 500 replies; figures in docs/performance
"""
from __future__ import annotations

import asyncio
import collections
import gc
import json
import sys
import time

import pytest

from engine import envs
from tests.app.soak_meter import content, grown, growth_split, heap_mb, rss_mb, sample, slope_between
from tests.app.support import loop, run, store, wait_until  # noqa: F401
from tests.server_support import ServerThread

FULL = envs.PAGEDECK_SOAK_REPLIES is not None
REPLIES = envs.PAGEDECK_SOAK_REPLIES if FULL else 24
RELOAD_EVERY = envs.PAGEDECK_SOAK_RELOAD_EVERY  # a shorter run can reload more often
# Each chat is replaced by a fresh one after this many replies of its own (0: never), so what the chats hold
# stops growing after warm-up and any growth left is a leak, not longer transcripts; staggered, one chat at
# a time, so the content stays about level between samples
ROTATE = envs.PAGEDECK_SOAK_ROTATE if envs.PAGEDECK_SOAK_ROTATE is not None else 4 if FULL else 0
LEAK_MB_PER_1000 = 20  # after warm-up, between reloads, with the chats' content level
RELOAD_MB = 30  # a reload's mean step (glibc keeps part of the load's freed heap; the old model is ~0.5-1 GB)
FRAME_MS = 1000 / 60
QT_SCAN_EVERY = 100  # replies between the meter's Qt object scans (they leave wrappers behind)
PROMPTS = ["Say hi.", "Name a colour.", "Count to three.", "One word for happy?", "What is 2+2?",
           "Name a fruit.", "Say goodbye.", "A short greeting, please."]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * 3600 if FULL else 900)]


class StallProbe:
    """A 10 ms QTimer; each tick's lateness is kept, and kept again under the scripted step it fell in
    (`set_step`): a late tick whose gap saw a user action (a switch, a reload...) or the meter's own scans
    counts under that step, not under streaming, so "stream" is the steady streaming alone."""

    PRIORITY = ("stream", "branch", "switch", "rotate", "remote", "reload", "meter")  # the last seen in a gap wins

    def __init__(self):
        from PySide6.QtCore import Qt, QTimer

        self.lateness: list[float] = []
        self.step = "stream"
        self.seen = {self.step}  # the steps the loop was in since the last tick
        self.last_step = self.step  # the step the last tick was counted under
        self.by_step: dict[str, list[float]] = collections.defaultdict(list)
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)
        self.last = time.perf_counter()
        self.timer.start()
        self.watch = None
        if envs.PAGEDECK_SOAK_WATCH:  # what the loop did in each late tick (tests/app/stall_watch.py);
            # a value ending .json: every gap is written there
            from tests.app.stall_watch import StallWatch

            self.watch = StallWatch(self)

    def _tick(self) -> None:
        now = time.perf_counter()
        late = max(0.0, now - self.last - 0.010)
        self.lateness.append(late)
        self.last_step = max(self.seen, key=self.PRIORITY.index)
        self.by_step[self.last_step].append(late)
        self.seen = {self.step}
        self.last = now

    def set_step(self, step: str) -> None:
        self.step = step
        self.seen.add(step)

    def p99_ms(self, *steps: str) -> float:
        """p99 lateness of the ticks counted under these steps (all ticks without any)."""
        ticks = [t for k in steps for t in self.by_step[k]] if steps else self.lateness
        ordered = sorted(ticks) or [0.0]
        return ordered[int(0.99 * (len(ordered) - 1))] * 1000


async def reply(pane, action) -> None:
    await action() if asyncio.iscoroutinefunction(action) else action()
    await wait_until(lambda: not pane.session.running, 300, "the reply")
    last = pane.session.messages[-1]
    assert last.role == "assistant" and last.stats.state == "done", (last.stats, last.content)


async def content_held(window, chat_ids: list[int]) -> dict:
    """What the chats open at the end hold: the heap in use and RSS before and after deleting them (and
    trimming the heap), with the transcript characters they had: longer chats legitimately hold more."""
    from engine.model.weights import release_freed_memory

    async def settle():
        for _ in range(3):
            await asyncio.sleep(0.05)
            gc.collect()
        release_freed_memory()

    await settle()
    chars, (heap, _), rss = content(window)["doc_chars"], heap_mb(), rss_mb()
    window.chat_list.delete(chat_ids)
    await settle()
    (heap_after, _), rss_after = heap_mb(), rss_mb()
    return {"doc_chars": chars, "heap_mb": round(heap - heap_after, 1), "rss_mb": round(rss - rss_after, 1)}


async def session(window, remote_url: str, replies: int, rotate: int = 0) -> dict:
    from app.core.store import ChatSettings

    settings = ChatSettings(max_new_tokens=6, seed=1, system_prompt="")  # short replies: 500 fit in ~30 min

    def fresh_chat(k: int):
        pane = window.new_chat(f"soak {k}")
        pane.session.set_settings(settings)
        return pane

    panes = [fresh_chat(k) for k in range(8)]
    probe = StallProbe()
    samples, warm_at = [], max(8, replies // 4, 8 * rotate + 8 if rotate else 0)
    every = 10  # the leak judge's slope needs many samples (tests/app/test_soak_meter.py)
    # A reload before warm-up (its one-time cost is not judged); the long run reloads every 150 replies after
    # it as well, and each must cost nothing more (the old model goes at the swap, its heap is trimmed)
    reload_at = {warm_at // 2} | set(range(RELOAD_EVERY, replies, RELOAD_EVERY))
    start = time.perf_counter()
    wrappers_now, wrappers_warm = collections.Counter(), collections.Counter()
    for i in range(replies):
        k = i % 8
        if rotate and i >= 8 and (i // 8 + k) % rotate == 0:  # a fresh chat for this one, two chats a round
            probe.set_step("rotate")
            window.chat_list.delete([panes[k].session.chat_id])
            panes[k] = fresh_chat(k)
        pane = panes[k]
        if i % 5 == 0:  # tiles of 2-4 and tabs, taking turns, the current chat changing
            probe.set_step("switch")
            window.chats.set_view("tiles", 2 + i % 3) if i % 10 == 0 else window.chats.set_view("tabs")
            window.chats.open_chat(pane.session.chat_id)
        if i in reload_at:  # the same model again: a new generator under the same chats
            probe.set_step("reload")
            assert await window.loader.load_model({"path": None, "cache_tokens": 8 * 512})
        if i % 20 == 10:  # one reply through a remote server, then back to the local model; in a chat of its
            # own, deleted after (the tiny server's 512-token context can't take a long chat's history)
            probe.set_step("remote")
            side = window.new_chat("remote")
            side.session.set_settings(settings)
            assert await window.remote.connect(remote_url)
            await reply(side, lambda: side.session.send(PROMPTS[i % 8]))
            await window.remote.disconnect()
            window.chat_list.delete([side.session.chat_id])
            await asyncio.sleep(0)
        elif i % 10 == 3 and pane.session.messages:
            probe.set_step("stream")
            await reply(pane, pane.session.regenerate)
        else:
            probe.set_step("stream")
            await reply(pane, lambda: pane.session.send(PROMPTS[i % 8]))
        if i % 25 == 12:  # branch from the reply just made, open it, then delete the branch
            probe.set_step("branch")
            branch_id = pane.session.branch(pane.session.messages[-1].id)
            window.chats.open_chat(branch_id)
            await asyncio.sleep(0)
            window.chat_list.delete([branch_id])
        if i + 1 == warm_at or (i + 1) % every == 0 or i + 1 == replies:
            probe.set_step("meter")  # the meter's own gc.collect() and object scans, not the app's
            window.chats.set_view("tabs")  # counted in one view: tiles show more widgets than tabs, by design
            await asyncio.sleep(0)
            gc.collect()
            await asyncio.sleep(0.05)  # deleteLater()s run
            scan = i + 1 == warm_at or (i + 1) % QT_SCAN_EVERY == 0 or i + 1 == replies  # soak_meter.sample
            samples.append(sample(window, i + 1, time.perf_counter() - start, wrappers_now, scan_qt=scan))
            if i + 1 == warm_at:
                wrappers_warm = collections.Counter(wrappers_now)
            print(f"app soak: {json.dumps(samples[-1])}", flush=True)  # progress, to watch a long run
    probe.timer.stop()
    if probe.watch is not None:
        probe.watch.stop()
        print(f"app soak stalls: {json.dumps(probe.watch.summary())}", flush=True)
        if envs.PAGEDECK_SOAK_WATCH.endswith(".json"):  # every gap, to read at leisure
            with open(envs.PAGEDECK_SOAK_WATCH, "w") as f:
                json.dump(probe.watch.gaps, f)
    await wait_until(lambda: window.service.snapshot()["pages_referenced"] == 0, 30, "the pages")
    held = await content_held(window, [p.session.chat_id for p in panes])
    return {"replies": replies, "rotate": rotate, "samples": samples, "warm_at": warm_at,
            "reloads_at": sorted(reload_at), "seconds": round(time.perf_counter() - start),
            # judged: streaming alone; reported: every tick but the meter's, every tick, and per step
            # [p99, max, ticks] (user actions may take a frame or two; the meter's scans are not the app's)
            "stall_p99_ms_stream": round(probe.p99_ms("stream"), 1),
            "stall_p99_ms_app": round(probe.p99_ms(*(k for k in probe.by_step if k != "meter")), 1),
            "stall_p99_ms": round(probe.p99_ms(), 1), "stall_max_ms": round(max(probe.lateness or [0]) * 1000, 1),
            "stall_p99_ms_by_step": {k: [round(probe.p99_ms(k), 1), round(max(v) * 1000, 1), len(v)]
                                     for k, v in sorted(probe.by_step.items())},
            "probe_ticks": len(probe.lateness), "wrappers grown after warm-up": grown(wrappers_warm, wrappers_now),
            "content held": held}


def test_many_replies_across_eight_chats_leave_memory_and_qt_objects_flat(qtbot, loop, tmp_path, tiny_llama_folder,
                                                                         capsys):
    from app.core.store import Store
    from app.local.engine_service import EngineService
    from app.window.main_window import MainWindow

    async def body(remote_url: str) -> dict:
        service = EngineService()
        if envs.PAGEDECK_SOAK_SWITCH_INTERVAL:  # to compare GIL switch intervals (the app sets 1 ms)
            sys.setswitchinterval(envs.PAGEDECK_SOAK_SWITCH_INTERVAL)
        assert await service.load({"path": None, "cache_tokens": 8 * 512})
        window = MainWindow(Store.open(tmp_path / "data"), service)
        qtbot.addWidget(window)
        window.resize(1600, 900)
        window.show()
        try:
            return await session(window, remote_url, REPLIES, ROTATE)
        finally:
            await window.shutdown()

    with ServerThread(tiny_llama_folder, cache_tokens=2048) as remote, capsys.disabled():
        result = run(loop, body(remote.url + "/v1"), 3 * 3600 if FULL else 800)
        samples = [s for s in result.pop("samples") if s["replies"] >= result["warm_at"]]
        for key in ("rss", "rss_found", "anon", "heap", "main_arena", "other_arenas", "kept", "py_blocks", "threads", "qt", "wrappers", "dead_wrappers", "doc_chars"):
            rows = [s for s in samples if s[key] is not None]  # the Qt counts: scanned samples only
            between, step = growth_split(rows, result["reloads_at"], key)
            result[f"{key}: per 1000 replies between reloads, per reload"] = [round(between, 1), round(step, 1)]
            result[f"{key}: least-squares per 1000 replies between reloads"] = round(
                slope_between(rows, result["reloads_at"], key), 1)
        print(f"app soak: {json.dumps(result)}")
    warm, end = samples[0], samples[-1]
    assert end["qt"] <= warm["qt"] + 20, f"Qt objects grew from {warm['qt']} to {end['qt']}"
    assert end["wrappers"] <= warm["wrappers"] + 50, f"Qt wrappers grew from {warm['wrappers']} to {end['wrappers']}"
    if FULL and ROTATE:  # a slow leak shows only over hundreds of replies, with the chats' content level
        for key in ("rss", "heap"):  # RSS read after a trim (soak_meter.sample); the slope over every sample
            _, step = result[f"{key}: per 1000 replies between reloads, per reload"]
            between = result[f"{key}: least-squares per 1000 replies between reloads"]
            assert between <= LEAK_MB_PER_1000, f"{key} grew {between:.1f} MB per 1000 replies between reloads"
            assert step <= RELOAD_MB, f"{key} grew {step:.1f} MB per reload"
        assert result["stall_p99_ms_stream"] < FRAME_MS, result
    else:  # a gross one at once: a reload that kept the old model (~0.5-1 GB) or a transcript per reply
        grew = end["rss"] - warm["rss"]
        assert grew <= 150, f"RSS grew {grew:.0f} MB in {end['replies'] - warm['replies']} replies"


def test_remote_connections_leave_no_poller_behind(qtbot, loop, store, tiny_llama_folder):
    """Each remote connection polls the server's metrics through its own poller; one that outlived its
    connection (kept by its Qt parent, with its timer and last task) added Qt objects per connect, which the
    long run's flat Qt-object count would catch only after hundreds of replies."""
    from app.remote.remote_mode import RemoteMetricsPoller
    from tests.app.support import make_window

    async def body(url: str) -> None:
        win = make_window(qtbot, store)
        for _ in range(4):
            assert await win.remote.connect(url)
            await asyncio.sleep(0.1)  # a poll or two
            await win.remote.disconnect()
            await asyncio.sleep(0)  # deleteLater()s run
        await asyncio.sleep(0.05)
        gc.collect()
        left = win.remote.findChildren(RemoteMetricsPoller)
        assert left == [], f"{len(left)} pollers left after 4 connections"

    with ServerThread(tiny_llama_folder, cache_tokens=2048) as remote:
        run(loop, body(remote.url + "/v1"), 120)

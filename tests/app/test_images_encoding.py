"""The vision encoder runs off the Qt event loop (a tiny random SmolVLM in the real app, pytest-qt, offscreen).

A chat sent with an image first has its images encoded on a worker thread (app.local.image_prompts):
the encoder is watched (its real encode, wrapped to note the thread, and held on an event where a test
needs it slow), so these tests fail if it ran on the main thread, if the window stalled while it ran, if
the job started before the embeddings existed, if Stop or closing the chat during the encode did not end
the reply, or if a failing encoder did more than fail its own reply.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import pytest
from PySide6.QtCore import QTimer

from app.core.backend import BackendSwitch
from tests.app.support import loaded_service, loop, run, store, wait_until  # noqa: F401
from tests.app.test_images_pane import SETTINGS, make_pane
from tests.app.test_images_vlm import noisy_picture

pytestmark = pytest.mark.timeout(300)


class Watched:
    """The service's vision encoder, its encode noted (thread, time) and optionally held or failing."""

    def __init__(self, vision, hold: threading.Event | None = None, fail: Exception | None = None):
        self.vision, self.hold, self.fail = vision, hold, fail
        self.calls: list[tuple[threading.Thread, float]] = []
        self.started = threading.Event()
        self._encode = vision.encode
        vision.encode = self.encode

    def encode(self, image):
        self.calls.append((threading.current_thread(), time.monotonic()))
        self.started.set()
        if self.hold is not None:
            assert self.hold.wait(60), "the test never released the encoder"
        if self.fail is not None:
            raise self.fail
        return self._encode(image)

    def restore(self) -> None:
        self.vision.encode = self._encode


class Probe:
    """A 10 ms QTimer on the main thread noting how late each tick fires (tests/app/test_stalls.py's probe)."""

    def __init__(self):
        self.gaps: list[float] = []
        self._last = time.perf_counter()
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)
        self.timer.start()

    def _tick(self) -> None:
        now = time.perf_counter()
        self.gaps.append(now - self._last)
        self._last = now

    def stop(self) -> float:
        self.timer.stop()
        return max(self.gaps, default=0.0)


def _attach_and_send(pane, picture, text="What is in this picture?"):
    pane.attachments.add_files([picture])
    pane.prompt.setPlainText(text)
    pane.submit()


def test_the_encoder_runs_on_a_worker_thread_the_window_keeps_ticking_and_the_job_waits_for_it(
        qtbot, loop, store, tiny_vlm_folder, tmp_path):  # noqa: F811
    """The encode is held 1 s or more on its thread: a probe on the main thread sees no stall near that long,
    another chat streams its whole reply meanwhile, and the image chat's job starts only after the encode."""
    async def body():
        service = await loaded_service(tiny_vlm_folder)
        hold = threading.Event()
        watched = Watched(service.vision, hold=hold)
        started_jobs = []
        start_job = service.start_job

        def noting_start_job(identifier, *args, **kwargs):
            started_jobs.append((identifier, time.monotonic()))
            return start_job(identifier, *args, **kwargs)

        service.start_job = noting_start_job
        try:
            image_pane = make_pane(qtbot, store, BackendSwitch(service), "image")
            text_pane = make_pane(qtbot, store, BackendSwitch(service), "text")
            text_pane.session.set_settings(replace(SETTINGS, max_new_tokens=24))
            picture = noisy_picture(tmp_path / "big.png", (1200, 900))
            image_pane.attachments.add_files([picture])  # checked and priced on the main thread (not measured)
            image_pane.prompt.setPlainText("What is in this picture?")
            probe = Probe()
            image_pane.submit()
            await wait_until(watched.started.is_set, 30, "the encoder to start")
            text_pane.prompt.setPlainText("Say something")
            text_pane.submit()  # streams while the image is being encoded
            await wait_until(lambda: text_pane.session.task.done(), 60, "the text chat's reply")
            assert not image_pane.session.task.done()
            assert image_pane.session.chat_id not in [i for i, _ in started_jobs]  # no job before its embeddings
            await asyncio.sleep(1.0)
            released = time.monotonic()
            hold.set()
            await wait_until(lambda: image_pane.session.task.done(), 120, "the image chat's reply")
            worst = probe.stop()
        finally:
            watched.restore()
            await service.close()
        assert watched.calls, "the image was never encoded"
        assert all(t is not threading.main_thread() for t, _ in watched.calls), "the encoder ran on the main thread"
        assert len(watched.calls) == 1  # encoded once: the count and the job read the prepared prompt
        image_reply = store.messages(image_pane.session.chat_id)[-1]
        text_reply = store.messages(text_pane.session.chat_id)[-1]
        assert text_reply.stats.state == "done" and text_reply.stats.new_tokens > 0
        assert image_reply.stats.state == "done" and image_reply.stats.new_tokens > 0
        job_started = dict(started_jobs)[image_pane.session.chat_id]
        assert job_started >= released
        print(f"\nworst main-thread gap while the image was encoded: {worst * 1000:.0f} ms")
        assert worst < 0.75, f"the main thread stalled {worst * 1000:.0f} ms while the image was encoded"

    run(loop, body())


def test_stop_and_closing_the_chat_during_the_encode_end_the_reply_and_the_chat_sends_again(
        qtbot, loop, store, tiny_vlm_folder, tmp_path):  # noqa: F811
    async def body():
        service = await loaded_service(tiny_vlm_folder)
        hold = threading.Event()
        watched = Watched(service.vision, hold=hold)
        try:
            pane = make_pane(qtbot, store, BackendSwitch(service), "stopped")
            _attach_and_send(pane, noisy_picture(tmp_path / "a.png", (200, 150), seed=5))
            await wait_until(watched.started.is_set, 30, "the encoder to start")
            await asyncio.wait_for(pane.session.stop(), 5)  # returns while the encoder is still held
            reply = store.messages(pane.session.chat_id)[-1]
            assert reply.stats.state == "stopped" and reply.content == ""
            assert service.running == [] and not pane.session.running
            # closing a chat cancels its task (app.window.chat_area): the same during an encode
            closing = make_pane(qtbot, store, BackendSwitch(service), "closing")
            watched.started.clear()
            _attach_and_send(closing, noisy_picture(tmp_path / "b.png", (180, 120), seed=6))
            await wait_until(watched.started.is_set, 30, "the second encode to start")
            closing.session.task.cancel()
            await asyncio.wait([closing.session.task], timeout=5)
            assert closing.session.task.done()
            assert store.messages(closing.session.chat_id)[-1].stats.state == "stopped"
            hold.set()
            watched.hold = None
            # the first chat sends again: its user message and image are still there, and a reply comes
            await pane.session.regenerate()
            await wait_until(lambda: pane.session.task.done(), 120, "the regenerated reply")
            assert store.messages(pane.session.chat_id)[-1].stats.state == "done"
            assert pane.session.images.of(pane.session.messages[0].id)
        finally:
            hold.set()
            watched.restore()
            await service.close()
        assert all(t is not threading.main_thread() for t, _ in watched.calls)

    run(loop, body())


def test_a_failing_encoder_fails_only_its_reply_with_a_message_and_keeps_the_message(
        qtbot, loop, store, tiny_vlm_folder, tmp_path):  # noqa: F811
    async def body():
        service = await loaded_service(tiny_vlm_folder)
        hold = threading.Event()
        watched = Watched(service.vision, hold=hold, fail=RuntimeError("the vision tower ran out of memory"))
        try:
            image_pane = make_pane(qtbot, store, BackendSwitch(service), "failing")
            text_pane = make_pane(qtbot, store, BackendSwitch(service), "text")
            text_pane.session.set_settings(replace(SETTINGS, max_new_tokens=32))
            _attach_and_send(image_pane, noisy_picture(tmp_path / "c.png", (160, 160), seed=7))
            await wait_until(watched.started.is_set, 30, "the encoder to start")
            text_pane.prompt.setPlainText("Keep talking")
            text_pane.submit()
            await wait_until(lambda: service.running, 30, "the text chat's job")
            hold.set()  # the encode fails while the other chat generates
            await wait_until(lambda: image_pane.session.task.done(), 60, "the failed reply")
            await wait_until(lambda: text_pane.session.task.done(), 60, "the text chat's reply")
            failed = store.messages(image_pane.session.chat_id)
            assert failed[-1].stats.state == "error"
            assert "ran out of memory" in (failed[-1].stats.error or "")
            assert "ran out of memory" in image_pane.view.toPlainText()
            assert failed[-2].role == "user" and failed[-2].content == "What is in this picture?"
            assert len(image_pane.session.images.of(failed[-2].id)) == 1
            text_reply = store.messages(text_pane.session.chat_id)[-1]
            assert text_reply.stats.state == "done" and text_reply.stats.new_tokens > 0
            assert service.running == []
        finally:
            hold.set()
            watched.restore()
            await service.close()
        assert all(t is not threading.main_thread() for t, _ in watched.calls)

    run(loop, body())


def test_a_prepared_prompt_is_the_one_made_on_the_loop_and_only_its_own_history_and_settings_find_it(
        tiny_vlm_folder, tmp_path):
    """app.local.image_prompts: the worker's prompt ids equal those made in place, and a different system prompt, thinking switch, tool list or history is made anew."""
    from app.core.images import attach_file
    from app.local.image_prompts import ImagePrompts
    from engine import Tokenizer
    from engine.vision import load_vision

    tokenizer, vision = Tokenizer.load(tiny_vlm_folder), load_vision(tiny_vlm_folder)
    watched = Watched(vision)
    history = [{"role": "user", "content": "What is it?",
                "images": [attach_file(noisy_picture(tmp_path / "d.png", (90, 60), seed=11))]}]
    prompts = ImagePrompts()
    asyncio.run(prompts.prepare(tokenizer, vision, history, SETTINGS))
    prepared = prompts.get(tokenizer, vision, history, SETTINGS)
    assert prepared is not None and watched.calls and watched.calls[0][0] is not threading.main_thread()
    fresh = ImagePrompts().of(tokenizer, vision, history, SETTINGS)  # made here (the encoder's cache holds it)
    assert prepared[0].tolist() == fresh[0].tolist()
    assert len(prepared[1]) == 1 and prepared[1][0].embeddings.shape[0] > 16
    tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for settings, tools, other in ((replace(SETTINGS, system_prompt="Be brief."), None, history),
                                   (replace(SETTINGS, thinking=not SETTINGS.thinking), None, history),
                                   (SETTINGS, tool, history),
                                   (SETTINGS, None, [{**history[0], "content": "And now?"}])):
        assert prompts.get(tokenizer, vision, other, settings, tools) is None
    assert prompts.get(tokenizer, vision, [dict(history[0])], SETTINGS) is prepared  # an equal history finds it

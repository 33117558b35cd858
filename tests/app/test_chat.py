"""Chat panes on a real generator (tiny random model): concurrency, stop, edit, regenerate, keys, settings."""
import asyncio

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QGuiApplication

from app.core.store import ChatSettings
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, visible_panes, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(240)


def _type_and_enter(qtbot, pane, text):
    qtbot.keyClicks(pane.prompt, text)
    qtbot.keyClick(pane.prompt, Qt.Key.Key_Return)


def test_three_chats_stream_concurrently(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        panes = [window.new_chat(f"chat {i}") for i in range(3)]
        for i, p in enumerate(panes):
            p.session.set_settings(ChatSettings(max_new_tokens=120, seed=i, system_prompt=""))
        window.chats.show_side_by_side(panes)
        assert len(visible_panes(window)) == 3
        first_text, finished = {}, {}
        for p in panes:
            cid = p.session.chat_id
            p.session.reply_changed.connect(
                lambda mid, s=p.session, c=cid: first_text.setdefault(c, asyncio.get_running_loop().time())
                if s.live(mid) and s.live(mid)[0] else None)
            p.session.reply_finished.connect(lambda _m, c=cid: finished.setdefault(c, asyncio.get_running_loop().time()))
        for i, p in enumerate(panes):
            _type_and_enter(qtbot, p, f"question {i}")
        await wait_until(lambda: len(finished) == 3, 180, "three replies")
        assert len(first_text) == 3
        assert max(first_text.values()) < min(finished.values()), "a chat finished before another had any text"
        # the generator's own record of its largest step, not a poll that a stalled machine could let slip past
        peak = window.service.snapshot()["batch_size_peak"]
        assert peak == 3, f"the generator never batched all three chats (largest step {peak})"
        for p in panes:
            user, reply = p.session.messages
            assert user.content.startswith("question")
            assert reply.stats.state == "done" and reply.stats.new_tokens == 120
            assert reply.stats.ttft_s > 0 and reply.stats.tokens_per_s > 0 and reply.stats.prompt_tokens > 0
            shown = p.view.toPlainText()
            assert reply.content.strip()[:20] in shown and "done · prompt" in shown and "tok/s" in shown
            assert window.store.messages(p.session.chat_id)[-1].content == reply.content
        await window.service.close()

    run(loop, body(), 200)


def test_stop_frees_the_job_and_its_pages(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        service = window.service
        pane = window.new_chat("stop me")
        pane.session.set_settings(ChatSettings(max_new_tokens=400))
        _type_and_enter(qtbot, pane, "go on forever")
        await wait_until(lambda: pane.session.live(pane.session.messages[-1].id)
                         and pane.session.live(pane.session.messages[-1].id)[1].new_tokens >= 3, what="streaming")
        assert service.snapshot()["pages_referenced"] > 0
        qtbot.keyClick(pane.prompt, Qt.Key.Key_Escape)
        await wait_until(lambda: not pane.session.running, 30, "the reply to stop")
        reply = pane.session.messages[-1]
        assert reply.stats.state == "stopped" and 3 <= reply.stats.new_tokens < 400
        assert window.store.messages(pane.session.chat_id)[-1].stats.state == "stopped"
        assert service.running == []
        m = service.generator.metrics()
        assert m["active_jobs"] + m["pending_jobs"] == 0
        m = service.snapshot()
        assert m["active_jobs"] == 0 and m["pages_referenced"] == 0
        assert m["pages_free"] + m["pages_cached"] == m["pages_total"]
        assert "stopped" in pane.view.toPlainText()
        await service.close()

    run(loop, body())


def test_edit_truncates_and_regenerate_replaces(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        service = window.service
        pane = window.new_chat()
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=12, seed=5))
        for text in ("first", "second"):
            _type_and_enter(qtbot, pane, text)
            await wait_until(lambda: not s.running and s.messages[-1].role == "assistant", what="reply")
        assert [m.role for m in s.messages] == ["user", "assistant"] * 2
        assert window.chat_list.titles() == ["first"]  # titled from the first message

        first_user, first_reply = s.messages[0], s.messages[1]
        pane._anchor(QUrl(f"pd:edit/{first_user.id}"))
        assert pane.editing == first_user.id and pane.prompt.toPlainText() == "first"
        assert not pane.banner.isHidden()
        pane.prompt.selectAll()
        _type_and_enter(qtbot, pane, "first, edited")
        await wait_until(lambda: not s.running and len(s.messages) == 2 and s.messages[0].content == "first, edited"
                         and s.messages[1].stats.state == "done", what="edited reply")
        stored = window.store.messages(s.chat_id)
        assert [m.content for m in stored][:1] == ["first, edited"] and len(stored) == 2
        assert first_reply.id not in [m.id for m in stored]

        # Same seed, same history: regenerate reproduces the reply under a new message id.
        before = s.messages[1]
        pane.regen_btn.click()
        await wait_until(lambda: not s.running and s.messages[-1].id != before.id
                         and s.messages[-1].stats.state == "done", what="regenerated reply")
        assert len(s.messages) == 2 and s.messages[-1].content == before.content
        s.set_settings(ChatSettings(max_new_tokens=12, seed=6))
        pane.regenerate()
        await wait_until(lambda: not s.running and s.messages[-1].stats.state == "done"
                         and s.messages[-1].content != before.content, what="reply with another seed")
        assert [m.id for m in window.store.messages(s.chat_id)] == [m.id for m in s.messages]
        await service.close()

    run(loop, body())


def test_enter_sends_and_shift_enter_adds_a_line(qtbot, loop, store):
    async def body():
        window = make_window(qtbot, store)
        pane = window.new_chat()
        qtbot.keyClicks(pane.prompt, "line one")
        qtbot.keyClick(pane.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
        assert pane.prompt.toPlainText() == "line one\n" and pane.session.messages == []
        qtbot.keyClicks(pane.prompt, "line two")
        qtbot.keyClick(pane.prompt, Qt.Key.Key_Return)
        assert pane.prompt.toPlainText() == ""
        await wait_until(lambda: not pane.session.running, what="reply to fail")
        user, reply = pane.session.messages
        assert user.content == "line one\nline two"
        # No model loaded: the reply shows the error instead of hanging or raising into the loop.
        assert reply.stats.state == "error" and "no model" in reply.stats.error
        assert "no model" in pane.view.toPlainText()
        qtbot.keyClick(pane.prompt, Qt.Key.Key_Return)  # empty prompt: nothing is sent
        assert len(pane.session.messages) == 2

    run(loop, body())


def test_copy_puts_the_message_markdown_on_the_clipboard(qtbot, loop, store):
    async def body():
        window = make_window(qtbot, store)
        pane = window.new_chat()
        msg = window.store.add_message(pane.session.chat_id, "user", "some **bold** `code`")
        pane.session.messages.append(msg)
        pane.rebuild()
        pane._anchor(QUrl(f"pd:copy/{msg.id}"))
        assert QGuiApplication.clipboard().text() == "some **bold** `code`"

    run(loop, body())


def test_system_prompt_and_chat_template_reach_the_prompt(loop, tiny_model):
    async def body():
        service = await loaded_service(tiny_model)
        history = [{"role": "user", "content": "hi there"}]
        short = service.prompt_ids(history, ChatSettings(system_prompt="Hi."))
        with_sys = service.prompt_ids(history, ChatSettings(system_prompt="You are a pirate."))
        text = service.tokenizer.decode(with_sys[0].tolist(), decode_special_tokens=True)
        assert "You are a pirate." in text and "hi there" in text
        assert text == service.tokenizer.apply_chat_template(
            [{"role": "system", "content": "You are a pirate."}] + history, add_generation_prompt=True)
        assert with_sys.shape[-1] > short.shape[-1]
        await service.close()

    run(loop, body())


def test_settings_dialog_round_trip_and_validation(qtbot, loop, store):
    from app.panels.settings_dialog import SettingsDialog

    async def body():
        window = make_window(qtbot, store)
        pane = window.new_chat("tuned")
        original = ChatSettings(system_prompt="Be kind.", temperature=0.3, top_k=0, top_p=0.9, min_p=0.05,
                                repetition_penalty=1.1, max_new_tokens=77, seed=9, stop_strings=("END", "a\nb"))
        dlg = SettingsDialog(original)
        qtbot.addWidget(dlg)
        assert dlg.settings() == original  # every field shown and read back, newline in a stop string included
        assert dlg.stop_strings.toPlainText() == "END\na\\nb"
        dlg.seed.setValue(-1)
        dlg.top_k.setValue(40)
        dlg.stop_strings.setPlainText("STOP\n\n")
        got = dlg.settings()
        assert got.seed is None and got.top_k == 40 and got.stop_strings == ("STOP",)
        dlg.top_p.setValue(0.0)  # clamped by the spin box to its minimum, still valid
        assert dlg.settings().top_p == 0.01
        pane.session.set_settings(got)
        assert store.chat(pane.session.chat_id).settings == got

    run(loop, body())


def test_stop_while_waiting_for_the_model_is_immediate(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store)
        load = window.loader.load_model({"path": str(tiny_model), "cache_tokens": 4096})
        pane = window.new_chat()
        pane.send("waiting")
        task = pane.session.task
        await pane.session.stop()
        assert task.done() and not load.done()
        reply = pane.session.messages[-1]
        assert reply.stats.state == "stopped" and store.messages(pane.session.chat_id)[-1].stats.state == "stopped"
        await load
        await window.service.close()

    run(loop, body())


def test_reply_tracker_times_token_events():
    from app.chat.chat_session import ReplyTracker

    t = ReplyTracker(sent_at=10.0, prompt_tokens=50)
    t.feed({"stage": "deferred"}, 10.1)
    assert t.stats.state == "deferred"
    t.feed({"stage": "started", "cached_tokens": 32}, 10.5)
    t.feed({"stage": "prefill", "curr_progress": 40, "max_progress": 50}, 10.6)
    assert (t.stats.state, t.stats.progress, t.stats.cached_tokens) == ("prefill", 0.8, 32)
    t.feed({"stage": "streaming", "text": "Hel", "token_ids": [1], "eos": False}, 11.0)
    assert t.stats.ttft_s == 1.0 and t.stats.tokens_per_s is None and t.stats.state == "streaming"
    t.feed({"stage": "streaming", "text": "", "token_ids": [], "eos": False}, 11.2)  # held text: no token, no rate change
    t.feed({"stage": "streaming", "text": "lo", "token_ids": [2, 3], "eos": False}, 11.5)
    assert t.stats.tokens_per_s == 4.0  # 2 tokens after the first, in 0.5 s
    t.feed({"stage": "streaming", "text": "!", "token_ids": [4], "eos": True, "eos_reason": "stop_string",
            "prompt_tokens": 50, "cached_tokens": 32, "new_tokens": 4}, 12.0)
    assert t.text == "Hello!" and t.stats.state == "done" and t.stats.eos_reason == "stop_string"
    assert t.stats.tokens_per_s == 3.0 and t.stats.new_tokens == 4
    c = ReplyTracker(0.0)
    c.feed({"stage": "streaming", "text": "", "token_ids": [], "eos": True, "eos_reason": "cancelled"}, 1.0)
    assert c.stats.state == "stopped" and c.stats.ttft_s is None

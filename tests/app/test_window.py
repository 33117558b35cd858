"""Main window: model loading errors, tabs/tiles, chat list, export, reopening history, metrics, LoRA defer."""
import asyncio
import json

import pytest
from PySide6.QtWidgets import QFileDialog

from app.core.store import ChatSettings, ReplyStats
from tests.app.support import (TINY_CACHE_TOKENS, loaded_service, loop, make_window, run, store,  # noqa: F401
                                    tiny_model, visible_panes, wait_until)

pytestmark = pytest.mark.timeout(240)


def test_bad_model_path_shows_error_and_keeps_previous_model(qtbot, loop, store, tiny_model, tmp_path):
    async def body():
        win = make_window(qtbot, store)
        assert await win.loader.load_model({"path": str(tiny_model), "cache_tokens": TINY_CACHE_TOKENS}) is True
        generator = win.service.generator
        assert win.service.info["path"] == str(tiny_model)
        assert tiny_model.name in win.status.model_status.text()

        assert await win.loader.load_model({"path": str(tmp_path / "no-such-model")}) is False
        assert "does not exist" in win.status.last_error and f"still using {tiny_model.name}" in win.status.last_error
        assert win.service.generator is generator and win.service.info["path"] == str(tiny_model)
        if win.model_panel is not None:
            assert "does not exist" in win.model_panel.error_label.text()

        broken = tmp_path / "broken.gguf"
        broken.write_bytes(b"not a gguf file at all")
        assert await win.loader.load_model({"path": str(broken)}) is False  # fails inside the loader thread
        assert "Could not load model" in win.status.last_error and win.service.generator is generator

        # The previous model still answers.
        pane = win.new_chat()
        pane.session.set_settings(ChatSettings(max_new_tokens=6))
        pane.send("still there?")
        await wait_until(lambda: not pane.session.running, what="reply")
        assert pane.session.messages[-1].stats.state == "done"
        await win.service.close()

    run(loop, body())


def test_tabs_and_tiles(qtbot, loop, store):
    async def body():
        win = make_window(qtbot, store)
        panes = [win.new_chat(f"c{i}") for i in range(4)]
        assert win.chats.tabs.count() == 4 and visible_panes(win) == [panes[3]]
        win.chats.set_view("tiles", 4)
        assert set(visible_panes(win)) == set(panes)
        win.chats.set_view("tiles", 2)
        assert set(visible_panes(win)) == {panes[3], panes[2]}  # the two most recent
        win.chats.open_chat(panes[0].session.chat_id)
        assert set(visible_panes(win)) == {panes[0], panes[3]}
        win.chats.set_view("tabs")
        assert win.chats.tabs.count() == 4 and len(visible_panes(win)) == 1
        win.chats.close_chat(panes[1].session.chat_id)
        assert win.chats.tabs.count() == 3 and panes[1].parent() is win.chats.parking
        with pytest.raises(ValueError, match="2-4 tiles"):
            win.chats.set_view("tiles", 5)

    run(loop, body())


def test_chat_list_create_rename_search_delete(qtbot, loop, store):
    async def body():
        win = make_window(qtbot, store)
        a = win.new_chat("Alpha").session.chat_id
        b = win.new_chat("Beta").session.chat_id
        assert win.chat_list.titles() == ["Beta", "Alpha"]
        item = win.chat_list.list.item(1)
        item.setText("Gamma")  # an in-place edit
        assert store.chat(a).title == "Gamma" and win.chats.tabs.tabText(win.chats.tabs.indexOf(win.chats.panes[a])) == "Gamma"
        item = win.chat_list.list.item(0)
        item.setText("   ")  # empty titles are refused, the old one comes back
        assert store.chat(b).title == "Beta" and "Beta" in win.chat_list.titles()
        store.add_message(b, "user", "a message about zebras")
        win.chat_list.search.setText("zebra")
        assert win.chat_list.ids() == [b]
        win.chat_list.search.setText("gam")
        assert win.chat_list.ids() == [a]
        win.chat_list.search.clear()
        win.chat_list.select(b)
        win.chat_list.confirm_delete = lambda n: False
        win.chat_list.delete_selected()
        assert len(store.chats()) == 2
        win.chat_list.confirm_delete = lambda n: True
        win.chat_list.delete_selected()
        assert [c.id for c in store.chats()] == [a] and b not in win.chats.panes and win.chats.tabs.count() == 1

    run(loop, body())


def test_history_reopens_in_a_new_window(qtbot, loop, store, tmp_path):
    async def body():
        chat = store.create_chat("Saved", ChatSettings(temperature=0.1))
        store.add_message(chat.id, "user", "Show code")
        r = store.add_message(chat.id, "assistant", "")
        store.update_reply(r.id, "Here:\n\n```python\nprint('hi')\n```", ReplyStats(state="done", prompt_tokens=7, new_tokens=9, tokens_per_s=3.5))
        win = make_window(qtbot, store)
        pane = win.chats.open_chat(chat.id)
        text = pane.view.toPlainText()
        assert "Show code" in text and "print('hi')" in text and "done · prompt 7 tok" in text and "3.5 tok/s" in text
        assert pane.session.settings.temperature == 0.1
        assert "```" not in text  # rendered as Markdown, not shown raw

    run(loop, body())


def test_export_current_chat(qtbot, loop, store, tmp_path, monkeypatch):
    async def body():
        win = make_window(qtbot, store)
        pane = win.new_chat("Exported")
        store.add_message(pane.session.chat_id, "user", "hello")
        for suffix in (".md", ".json"):
            target = tmp_path / f"out{suffix}"
            monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, t=target, **k: (str(t), ""))
            assert win.export_current(suffix) == target
        assert "# Exported" in (tmp_path / "out.md").read_text()
        assert json.loads((tmp_path / "out.json").read_text())["messages"][0]["content"] == "hello"

    run(loop, body())


def test_metrics_are_pushed_about_ten_times_a_second(qtbot, loop, store, tiny_model):
    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        got = []
        win.service.metrics.connect(got.append)
        await wait_until(lambda: len(got) >= 3, 10, "three metric snapshots")
        assert got[-1]["pages_total"] == TINY_CACHE_TOKENS // 256
        # the window's own wiring feeds its dashboard: the charts gain samples as the snapshots come
        dash = win.dashboard
        await wait_until(lambda: dash.snapshot is not None, 10, "the dashboard's first snapshot")
        seen = len(got)
        await wait_until(lambda: len(got) >= seen + 2, 10, "two more metric snapshots")
        assert dash.snapshot["snapshot_time"] == got[-1]["snapshot_time"]  # it shows the latest one
        assert dash.snapshot["pages_total"] == TINY_CACHE_TOKENS // 256 and len(dash.series) >= 3
        await win.service.close()

    run(loop, body())


def test_lora_swap_while_busy_defers_new_requests(qtbot, loop, store, tiny_model):
    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        pending, active, failures = [], [], []
        win.service.lora_failed.connect(failures.append)
        win.service.loras_pending.connect(pending.append)
        win.service.loras_active.connect(active.append)
        busy, later = win.new_chat("busy"), win.new_chat("later")
        busy.session.set_settings(ChatSettings(max_new_tokens=300))
        later.session.set_settings(ChatSettings(max_new_tokens=5))
        busy.send("keep going")
        await wait_until(lambda: busy.session.live(busy.session.messages[-1].id)[1].new_tokens > 0, what="streaming")
        # The empty set takes the real swap path without adapter files (adapters: the LoRA panel's tests).
        swap_task = asyncio.ensure_future(win.service.apply_loras([]))
        await wait_until(lambda: pending == [True], what="pending swap")
        later.send("wait for the swap")
        reply = later.session.messages[-1]
        await wait_until(lambda: later.session.live(reply.id) and later.session.live(reply.id)[1].state == "deferred",
                         what="deferred state")
        assert busy.session.running and not swap_task.done()
        await wait_until(lambda: not later.session.running, 120, "the deferred reply")
        assert swap_task.result() is True, failures
        assert pending == [True, False] and active == [[]]
        assert reply.stats.state == "done" and not busy.session.running  # the swap waited for the running job
        await win.service.close()

    run(loop, body())


def test_sent_while_loading_waits_then_delete_stops_a_running_reply(qtbot, loop, store, tiny_model):
    async def body():
        win = make_window(qtbot, store)
        load = win.loader.load_model({"path": str(tiny_model), "cache_tokens": TINY_CACHE_TOKENS})
        pane = win.new_chat("early")
        pane.session.set_settings(ChatSettings(max_new_tokens=5))
        pane.send("typed before the model was up")
        reply = pane.session.messages[-1]
        assert pane.session.live(reply.id)[1].state == "queued" and not load.done()
        await wait_until(lambda: not pane.session.running, what="the queued reply")
        assert reply.stats.state == "done" and reply.stats.new_tokens == 5

        pane.session.set_settings(ChatSettings(max_new_tokens=400))
        pane.send("a long one")
        await wait_until(lambda: pane.session.live(pane.session.messages[-1].id)[1].new_tokens > 0, what="streaming")
        task = pane.session.task
        win.chat_list.delete([pane.session.chat_id])
        await wait_until(task.done, 30, "the deleted chat's reply to stop")
        assert store.chats() == [] and win.service.running == []
        await wait_until(lambda: win.service.snapshot()["active_jobs"] == 0, 30, "the job to leave the generator")
        await win.service.close()

    run(loop, body())


def test_model_panel_options_reach_the_engine(qtbot, loop, store, tiny_model):
    async def body():
        win = make_window(qtbot, store)
        ok = await win.loader.load_model({"path": str(tiny_model), "cache_tokens": 2048, "kv_quant": "q8",
                                   "draft_model": None, "use_ngram": False})
        assert ok, win.status.last_error
        assert win.service.info["kv_quant"] == "q8" and win.service.info["pages"] == 8
        assert win.service.cache.kv_quant == "q8"
        pane = win.new_chat()
        pane.session.set_settings(ChatSettings(max_new_tokens=4))
        pane.send("quantized cache")
        await wait_until(lambda: not pane.session.running, what="reply")
        assert pane.session.messages[-1].stats.state == "done"
        assert await win.loader.load_model({"path": str(tiny_model), "cache_tokens": 100}) is False
        assert "cache_tokens" in win.status.last_error and win.service.info["kv_quant"] == "q8"
        await win.service.close()

    run(loop, body())

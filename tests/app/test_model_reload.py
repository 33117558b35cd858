"""Loading a model while the app runs: the LoRA panel follows the engine after a reload, a failed load's
message stays in the status bar, and a load while replies run asks first."""
import asyncio

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.core.store import ChatSettings
from tests.app.support import (TINY_CACHE_TOKENS, loaded_service, loop, make_window, run, store,  # noqa: F401
                               tiny_model, wait_until)
from tests.engine.test_async_api import write_adapter
from tests.tiny_models import write_tiny_model

pytestmark = pytest.mark.timeout(240)


def ticked(panel) -> list[str]:
    return [panel.table.item(r, panel.COL_NAME).text() for r in range(panel.table.rowCount())
            if panel.table.item(r, panel.COL_NAME).checkState() == Qt.CheckState.Checked]


def test_failed_load_message_stays_in_the_status_bar(qtbot, loop, store, tiny_model, tmp_path):
    async def body():
        win = make_window(qtbot, store)
        assert await win.loader.load_model({"path": str(tiny_model), "cache_tokens": TINY_CACHE_TOKENS})
        assert win.statusBar().currentMessage().startswith("Loaded ")
        broken = tmp_path / "broken.gguf"
        broken.write_bytes(b"not a gguf file at all")
        assert await win.loader.load_model({"path": str(broken)}) is False
        message = win.statusBar().currentMessage()
        assert "Could not load model" in message and "Loaded" not in message, message
        assert tiny_model.name in win.status.model_status.text()  # the model still running is still named
        await win.service.close()

    run(loop, body())


def test_reload_reapplies_the_lora_set_or_says_it_was_dropped(qtbot, loop, store, tiny_model, tmp_path):
    async def body():
        adapters = tmp_path / "loras"
        write_adapter(adapters / "tiny-pirate")
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        panel, service = win.lora_panel, win.service
        panel.add_folder(adapters)
        panel.set_selection({"tiny-pirate": 0.5})
        panel.apply_button.click()
        await wait_until(lambda: panel.active_label.text() == "Default LoRA: tiny-pirate", what="the swap")
        assert ticked(panel) == ["tiny-pirate"]

        # Reloading a model the adapter fits keeps the set, in the engine and in the panel.
        assert await win.loader.load_model({"path": str(tiny_model), "cache_tokens": TINY_CACHE_TOKENS})
        pirate = str(adapters / "tiny-pirate")
        assert service.chat_loras == ((pirate, 0.5),)
        assert service.snapshot()["loras"] == ["tiny-pirate"]  # what the new generator really runs
        assert panel.active_label.text() == "Default LoRA: tiny-pirate" and ticked(panel) == ["tiny-pirate"]

        # A model it does not fit (other widths) drops it, and the panel and the status bar say so.
        other = write_tiny_model(tmp_path / "wider", hidden_size=96, num_attention_heads=6, head_dim=16)
        assert await win.loader.load_model({"path": str(other), "cache_tokens": TINY_CACHE_TOKENS})
        assert service.chat_loras == () and service.snapshot()["loras"] == []
        assert panel.active_label.text() == "Default LoRA: none" and ticked(panel) == []
        assert "LoRA tiny-pirate dropped" in panel.error_label.text() and "LoRA tiny-pirate dropped" in win.status.last_error
        await service.close()

    run(loop, body())


def answer(win, text: str) -> None:
    box = win.loader.load_question
    assert box is not None and box.isVisible(), "no question before the load"
    button = next((b for b in box.buttons() if b.text() == text), None) or box.button(QMessageBox.StandardButton.Cancel)
    button.click()


def test_load_while_replies_run_asks_first(qtbot, loop, store, tiny_model):
    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        service, panel = win.service, win.model_panel
        current, loads, jobs = [], [], []  # the reply started last; its state and the jobs at each load's end
        service.loaded.connect(lambda info: (loads.append(current[-1].stats.state), jobs.append(service.running)))
        panel.path_edit.setText(str(tiny_model))
        panel.cache_spin.setValue(TINY_CACHE_TOKENS)

        async def start_reply(title):
            pane = win.new_chat(title)
            pane.session.set_settings(ChatSettings(max_new_tokens=400, seed=7))  # seeded: no early end
            pane.send("keep going")
            current.append(pane.session.messages[-1])
            await wait_until(lambda: pane.session.live(current[-1].id)[1].new_tokens > 0, what="streaming")
            return pane, current[-1]

        # Cancel: nothing is loaded, the reply goes on, the Load button works again.
        pane, reply = await start_reply("cancel")
        panel.load_button.click()
        assert not panel.load_button.isEnabled()
        answer(win, "Cancel")
        assert panel.load_button.isEnabled() and pane.session.running and not service.loading
        await wait_until(lambda: not pane.session.running, 120, "the reply")
        assert reply.stats.state == "done" and loads == []

        # Wait: the reply ends normally, then the model loads; a reply sent meanwhile runs on the new model.
        pane, reply = await start_reply("wait")
        panel.load_button.click()
        answer(win, "Load when they finish")
        await wait_until(lambda: service.loading, what="the waiting load")
        later = win.new_chat("later")
        later.session.set_settings(ChatSettings(max_new_tokens=4))
        later.send("sent while the load waits")
        old_generator = service.generator
        await wait_until(lambda: loads, 120, "the load")
        assert loads == ["done"] and service.generator is not old_generator  # the reply ended before the swap
        await wait_until(lambda: not later.session.running, 60, "the queued reply")
        assert later.session.messages[-1].stats.state == "done"

        # Stop: the model loads at once, and no reply is left running on the old generator (one still
        # running when the new model is ready is stopped, its text so far kept).
        pane, reply = await start_reply("stop")
        panel.load_button.click()
        answer(win, "Stop replies and load")
        await wait_until(lambda: service.loading, what="the load")
        assert pane.session.running  # it did not wait for the reply
        await wait_until(lambda: len(loads) == 2, 120, "the second load")
        await wait_until(lambda: not pane.session.running, 30, "the reply to end")
        assert jobs == [[], []] and service.running == []
        assert reply.stats.new_tokens > 0 and reply.content, reply.stats
        assert panel.load_button.isEnabled()
        await service.close()

    run(loop, body())


def test_a_reload_lets_the_old_model_and_cache_go(qtbot, loop, store, tiny_model):
    """After what a long session does (replies in tiles and tabs, a regenerate, a branch opened and deleted, a
    reply through a remote server) and a reload, nothing holds the previous Model, PagedCache, generator or
    tokenizer, and no reference cycle does either: they go when the new model replaces them (weak references
    die with the garbage collector off), so their memory comes back at once."""
    import gc
    import weakref

    from tests.server_support import ServerThread

    async def body(remote_url: str):
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        service = win.service
        panes = [win.new_chat(f"reload {i}") for i in range(3)]
        win.chats.set_view("tiles", 3)
        for pane in panes:
            pane.session.set_settings(ChatSettings(max_new_tokens=4, seed=3))
            pane.send("hello there")
            await wait_until(lambda: not pane.session.running, 60, "the reply")
        await panes[0].session.regenerate()
        await wait_until(lambda: not panes[0].session.running, 60, "the regenerated reply")
        branch_id = panes[1].session.branch(panes[1].session.messages[-1].id)
        win.chats.open_chat(branch_id)
        await asyncio.sleep(0)
        win.chat_list.delete([branch_id])
        win.chats.set_view("tabs")
        assert await win.remote.connect(remote_url)
        panes[2].send("through the remote server")
        await wait_until(lambda: not panes[2].session.running, 60, "the remote reply")
        await win.remote.disconnect()
        await asyncio.sleep(0.3)  # metrics snapshots reach the dashboard and the page map
        old = {type(o).__name__: weakref.ref(o) for o in (service.model, service.cache, service.generator,
                                                          service.generator._generator, service.tokenizer)}
        gc.disable()  # they must go by reference counting at the swap, not at some later full collection
        try:
            assert await win.loader.load_model({"path": str(tiny_model), "cache_tokens": TINY_CACHE_TOKENS})
            panes[1].send("and on the new model")
            await wait_until(lambda: not panes[1].session.running, 60, "a reply on the new model")
            await asyncio.sleep(0.3)  # deleteLater()s and queued signals run
            alive = {name: ref() for name, ref in old.items() if ref() is not None}
        finally:
            gc.enable()
        holders = {name: sorted({type(h).__name__ for h in gc.get_referrers(obj)}) for name, obj in alive.items()}
        del alive
        gc.collect()
        kept = [name for name, ref in old.items() if ref() is not None]
        assert not holders, f"still alive after the reload: {holders}; after a full collection: {kept}"
        await service.close()

    with ServerThread(tiny_model, cache_tokens=2048) as remote:
        run(loop, body(remote.url + "/v1"), 200)

"""Per-chat LoRA adapters in the app: loaded from the LoRA panel, picked in each chat's settings
dialog, run in one batch, recorded with every reply (stats, export), coloured on the page map.

Real widgets (pytest-qt), real PEFT adapters, the real generator; each reply is checked against the engine
running that chat's prompt alone with the same adapters (greedy, dense fp32).
"""
from __future__ import annotations

import asyncio
import json
import threading

import pytest
from PySide6.QtCore import Qt

from app.core.export import to_json, to_markdown
from app.core.store import ChatSettings, Store
from app.panels.settings_dialog import SettingsDialog
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

GREEDY_CHAT = dict(max_new_tokens=10, temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
                   system_prompt="")


@pytest.fixture(scope="module")
def adapters(tiny_llama_folder, tmp_path_factory):
    from tests.engine.test_lora import write_peft_adapter

    root = tmp_path_factory.mktemp("chat-adapters")
    return {"ada": write_peft_adapter(tiny_llama_folder, root / "ada", seed=11),
            "bob": write_peft_adapter(tiny_llama_folder, root / "bob", seed=12, targets=["q_proj", "v_proj"])}


def solo_text(service, history, settings: ChatSettings, adapters) -> str:
    """The oracle: this chat's prompt alone on a fresh generator over the same model, same adapters."""
    import engine

    gen = engine.DynamicGenerator(service.model, engine.PagedCache(service.model, max_tokens=1024, page_size=16),
                                  service.tokenizer)
    loras = [(gen.load_lora(adapters[name]), scale) for name, scale in settings.loras or ()]
    gen.enqueue(engine.DynamicJob(service.prompt_ids(history, settings), settings.max_new_tokens,
                                  gen_settings=settings.sampler_settings(), loras=loras,
                                  stop_conditions=sorted(service.tokenizer.stop_token_ids)))
    text = ""
    while gen.num_remaining_jobs():
        text += "".join(r.get("text", "") for r in gen.iterate() if r["stage"] == "streaming")
    return text


def test_chats_with_different_adapters_share_a_batch_and_record_them(qtbot, loop, store, tiny_model, adapters):
    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        s, panel = win.service, win.lora_panel
        panel.add_folder(adapters["ada"].parent)
        for name in ("ada", "bob"):  # the LoRA panel's "loaded" column loads into the generator
            panel.table.item([a.name for a in panel.adapters()].index(name), panel.COL_LOADED).setCheckState(
                Qt.Checked)
        await wait_until(lambda: sorted(panel.loaded()) == ["ada", "bob"], what="both adapters loaded")
        assert sorted(s.loaded_adapters()) == ["ada", "bob"]  # the panel shows the generator's registry

        panes = {name: win.new_chat(name) for name in ("ada", "bob", "base")}
        for name, pane in panes.items():  # each chat picks its adapters in its settings dialog
            dlg = SettingsDialog(ChatSettings(**GREEDY_CHAT), adapters=s.adapter_names())
            qtbot.addWidget(dlg)
            assert dlg.loras.use_default.isChecked() and sorted(dlg.loras.names()) == ["ada", "bob"]
            dlg.loras.use_default.setChecked(False)
            if name != "base":
                row = dlg.loras.names().index(name)
                dlg.loras.table.item(row, 0).setCheckState(Qt.Checked)
                dlg.loras.table.cellWidget(row, 1).setValue(0.5 if name == "bob" else 1.0)
            pane.session.set_settings(dlg.settings())
        assert panes["bob"].session.settings.loras == (("bob", 0.5),)
        assert panes["base"].session.settings.loras == ()
        assert store.chat(panes["bob"].session.chat_id).settings.loras == (("bob", 0.5),)  # stored

        release = threading.Event()
        held = asyncio.ensure_future(s.generator.run_on_worker(lambda g: release.wait(60)))
        await asyncio.sleep(0)
        for name, pane in panes.items():
            pane.send(f"Hello {name}, tell me a story.")
        await wait_until(lambda: len(s.running) == 3, what="three replies enqueued")
        release.set()
        await held
        await wait_until(lambda: not any(p.session.running for p in panes.values()), 120, "the replies")

        m = s.snapshot()
        assert m["batch_size_peak"] == 3  # the three adapter sets ran in the same steps
        for name, pane in panes.items():
            reply, history = pane.session.messages[-1], [{"role": "user", "content": f"Hello {name}, tell me a story."}]
            want = {"ada": [("ada", 1.0)], "bob": [("bob", 0.5)], "base": []}[name]
            assert reply.stats.state == "done" and reply.stats.adapter_pairs() == want
            assert reply.content == solo_text(s, history, pane.session.settings, adapters)
            chat, messages = store.chat(pane.session.chat_id), store.messages(pane.session.chat_id)
            assert messages[-1].stats.adapter_pairs() == want  # survives in the store
            md, doc = to_markdown(chat, messages), json.loads(to_json(chat, messages))
            assert ({"ada": "LoRA ada×1", "bob": "LoRA bob×0.5", "base": "no LoRA"}[name]) in md
            assert doc["messages"][-1]["stats"]["adapters"] == [list(p) for p in want]
            assert doc["settings"]["loras"] == [list(p) for p in want]
        texts = {p.session.messages[-1].content for p in panes.values()}
        assert len(texts) == 3  # the adapters really changed the replies

        # The page map, coloured by adapter: one colour per set the pages' K/V was computed under.
        pm = win.dashboard.page_map
        pm.by_adapter.setChecked(True)
        pm.update_pages(m["page_states"], m["page_shared"], m["page_owner_identifiers"], m["page_adapters"],
                        m["adapter_sets"])
        labels = {i: pairs for i, pairs in m["adapter_sets"].items()}
        used = {i for i in m["page_adapters"] if i >= 0}
        assert sorted(map(tuple, (labels[i] for i in used))) == [(), (("ada", 1.0),), (("bob", 0.5),)]
        image = pm.pages.render()
        colours = {tuple(image[y, x]) for p in range(pm.pages.pages) if m["page_adapters"][p] >= 0
                   for x, y in [pm.pages.cell_origin(p)]}
        assert len(colours) == 3
        page = next(p for p in range(len(m["page_adapters"])) if labels.get(m["page_adapters"][p]) == [("bob", 0.5)])
        assert "LoRA bob×0.5" in pm.describe_page(page) and "bob×0.5" in pm.legend.text()
        pm.by_adapter.setChecked(False)
        assert len({tuple(pm.pages.render()[y, x]) for p in range(pm.pages.pages) if m["page_adapters"][p] >= 0
                    for x, y in [pm.pages.cell_origin(p)]}) == 1  # by job: all cached pages are one grey
        await win.shutdown()

    run(loop, body(), 300)


def test_a_chat_naming_an_unloaded_adapter_fails_alone_with_its_name(qtbot, loop, store, tiny_model):
    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        bad, good = win.new_chat("bad"), win.new_chat("good")
        bad.session.set_settings(ChatSettings(**{**GREEDY_CHAT, "loras": (("ghost", 1.0),)}))
        good.session.set_settings(ChatSettings(**GREEDY_CHAT))
        bad.send("hi")
        good.send("hi")
        await wait_until(lambda: not bad.session.running and not good.session.running, 60, "both replies")
        stats = bad.session.messages[-1].stats
        assert stats.state == "error" and "'ghost' is not loaded" in stats.error
        assert good.session.messages[-1].stats.state == "done"
        await wait_until(lambda: win.service.snapshot()["pages_referenced"] == 0, 30, "no page leaked")
        await win.shutdown()

    run(loop, body())


def test_chat_settings_loras_validate_and_round_trip():
    s = ChatSettings(loras=(("ada", 1.0), ("bob", -0.5)))
    assert ChatSettings.from_json(s.validate().to_json()) == s
    assert ChatSettings.from_json(ChatSettings().to_json()).loras is None  # None = the default set
    for bad in ((("ada", 1.0), ("ada", 2.0)), (("", 1.0),), (("ada", float("nan")),), (("ada", True),)):
        with pytest.raises(ValueError, match="loras"):
            ChatSettings(loras=bad).validate()


def test_stores_from_before_per_reply_adapters_gain_the_column(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite3"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE reply_stats DROP COLUMN adapters")  # the shape of a store written before replies recorded adapters
    db.commit()
    db.close()
    store = Store(path)
    chat = store.create_chat("old")
    msg = store.add_message(chat.id, "assistant", "hi")
    assert store.messages(chat.id)[0].stats.adapters is None and msg.stats.adapter_pairs() is None
    store.close()

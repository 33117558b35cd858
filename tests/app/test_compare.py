"""Compare mode in the real window on real generators (tiny random models): one message to the ticked
tiles with each pane's own settings, the shared prefix computed once (same page ids, cached tokens), a
second model loaded beside the first with both generating, the fit check refusing one that does not fit,
and the winner's two ways on."""
import pytest
from PySide6.QtCore import Qt

from app.core.store import ChatSettings
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(240)

LONG_SYSTEM = "You answer questions about the harbour. " + "The harbour has boats, ropes and gulls. " * 40


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny2") / "qwen2", arch="qwen2", seed=5)


def _compare_window(qtbot, service, store, settings: list[ChatSettings]):
    window = make_window(qtbot, store, service)
    panes = [window.new_chat(f"pane {i}") for i in range(len(settings))]
    for pane, s in zip(panes, settings):
        pane.session.set_settings(s)
    window.chats.show_side_by_side(panes)
    window.chats.set_compare(True)
    bar = window.chats.compare
    assert bar.isVisible() and [p.session.chat_id for p in bar.panes] == sorted(p.session.chat_id for p in panes)
    return window, panes, bar


def _done(panes) -> bool:
    return all(not p.session.running and p.session.messages and p.session.messages[-1].role == "assistant"
               and p.session.messages[-1].stats.state in ("done", "error") for p in panes)


def test_compare_sends_to_the_ticked_panes_with_their_own_settings(qtbot, loop, store, tiny_model):
    async def body():
        settings = [ChatSettings(system_prompt="Be brief.", max_new_tokens=5, seed=1, stop_on_loops=False),
                    ChatSettings(system_prompt="Be very long and detailed.", max_new_tokens=9, temperature=0.0,
                                 stop_on_loops=False),
                    ChatSettings(system_prompt="", max_new_tokens=7, seed=3, top_k=5, stop_on_loops=False)]
        window, panes, bar = _compare_window(qtbot, await loaded_service(tiny_model), store, settings)
        service = window.service
        bar.checks[panes[2].session.chat_id].setChecked(False)  # not this one
        qtbot.keyClicks(bar.prompt, "Which is the best harbour?")
        qtbot.keyClick(bar.prompt, Qt.Key.Key_Return)
        await wait_until(lambda: _done(panes[:2]), 120, "both ticked panes' replies")
        for pane, s in zip(panes[:2], settings):
            user, reply = pane.session.messages
            assert user.content == "Which is the best harbour?"
            history = [{"role": "user", "content": user.content}]
            assert reply.stats.prompt_tokens == service.count_tokens(history, s)  # its own system prompt
            assert reply.stats.new_tokens <= s.max_new_tokens  # its own reply length
        assert panes[0].session.messages[1].stats.prompt_tokens != panes[1].session.messages[1].stats.prompt_tokens
        assert panes[2].session.messages == []  # unticked: nothing sent
        from app.core.presets import BUILTIN_PRESETS, apply_preset

        cid = panes[2].session.chat_id
        assert bar.summaries[cid].text().startswith("T=")  # custom sampler values
        panes[2].session.set_settings(apply_preset(settings[2], BUILTIN_PRESETS["Precise"]))
        assert bar.summaries[cid].text() == "Precise · default LoRA set"  # the chip follows the pane's settings
        await service.close()

    run(loop, body())


def test_same_history_shares_the_prefix_pages_computed_once(qtbot, loop, store, tiny_model):
    """Two panes with the same system prompt and history on the same model: the second pane's prompt
    pages are the first one's page ids, and its reply reports them as cached tokens."""
    async def body():
        service = await loaded_service(tiny_model)
        jobs = {}
        real_start = service.start_job

        def start_job(identifier, history, settings):
            job, n = real_start(identifier, history, settings)
            jobs[identifier] = job
            return job, n
        service.start_job = start_job
        same = ChatSettings(system_prompt=LONG_SYSTEM, max_new_tokens=20, stop_on_loops=False)
        window, panes, bar = _compare_window(qtbot, service, store, [same, same, replace_seed(same, 7)])
        ids = [p.session.chat_id for p in panes]
        pages: dict[int, list[int]] = {}

        def record() -> bool:
            for cid, job in jobs.items():
                seq = job.job.seqs[0]
                if seq.pages and cid not in pages:
                    pages[cid] = [p.index for p in seq.pages]
            return _done(panes)

        sent = bar.send("Tell me about the gulls.")
        assert sent == panes
        # the leader goes first; the others (same prefix) wait until its prompt's pages are written
        assert panes[0].session.running and not panes[1].session.running and not panes[2].session.running
        await wait_until(record, 120, "the three replies")
        prompt = panes[0].session.messages[1].stats.prompt_tokens
        assert prompt > 256  # more than one full page of shared prefix
        full = (prompt - 1) // 256
        first = pages[ids[0]][:full]
        for cid, pane in zip(ids[1:], panes[1:]):
            assert pages[cid][:full] == first  # the same physical pages
            assert pane.session.messages[1].stats.cached_tokens >= full * 256  # found cached, not recomputed
        assert panes[0].session.messages[1].stats.cached_tokens == 0  # the leader computed them
        await service.close()

    run(loop, body())


def replace_seed(settings, seed):
    from dataclasses import replace

    return replace(settings, seed=seed)


def test_a_second_model_beside_the_first_both_generating(qtbot, loop, store, tiny_model, second_model):
    async def body():
        service = await loaded_service(tiny_model)
        window, panes, bar = _compare_window(qtbot, service, store, [
            ChatSettings(system_prompt="", max_new_tokens=40, seed=1, stop_on_loops=False),
            ChatSettings(system_prompt="", max_new_tokens=40, seed=1, stop_on_loops=False)])
        await bar.load_beside(str(second_model), panes[1])
        assert not bar.message.isVisible(), bar.message.text()
        assert [p for p, _ in service.models()] == [None, str(second_model)]
        assert panes[1].session.settings.model == str(second_model)
        assert bar.model_boxes[panes[1].session.chat_id].currentData() == str(second_model)
        dash = window.dashboard
        assert dash.model_choice.count() == 2 and not dash.model_choice.isHidden()
        main_gen, side_gen = service.generator, service.beside[str(second_model)].generator
        assert main_gen is not side_gen and service.cache is not service.beside[str(second_model)].cache

        def largest() -> dict:  # each generator's largest step so far
            return {"main": main_gen.metrics()["batch_size_peak"], "side": side_gen.metrics()["batch_size_peak"]}

        assert largest() == {"main": 0, "side": 0}
        bar.send("hello there")
        await wait_until(lambda: _done(panes), 120, "both models' replies")
        assert largest() == {"main": 1, "side": 1}  # each pane's job ran on its own model's generator
        a, b = (p.session.messages[1] for p in panes)
        assert a.stats.state == b.stats.state == "done" and a.stats.new_tokens == b.stats.new_tokens == 40
        assert a.content != b.content  # same seed and prompt, different weights
        dash.model_choice.setCurrentIndex(1)
        dash.model_choice.activated.emit(1)
        assert service.metrics_model == str(second_model)
        assert service.snapshot()["pages_total"] == side_gen.metrics()["pages_total"]
        # the fit check guards the models together: one whose estimate exceeds what is left is refused
        await service.unload_beside(str(second_model))
        assert [p for p, _ in service.models()] == [None] and dash.model_choice.isHidden()
        await bar.load_beside(str(second_model), panes[1], cache_tokens=1 << 36)  # 32 TiB of cache
        shown = bar.message.text()
        assert bar.message.isVisible() and "beside" in shown and "will not fit" in shown and "Try" in shown, shown
        assert list(service.beside) == []  # nothing half-loaded; the main model still serves
        panes[1].session.set_settings(ChatSettings(system_prompt="", max_new_tokens=5, model=str(second_model)))
        panes[1].send("again")
        await wait_until(lambda: _done(panes[1:]), 60, "the reply on an unloaded model")
        assert "is not loaded" in panes[1].session.messages[-1].stats.error
        await service.close()

    run(loop, body())


def test_winner_continue_and_branch(qtbot, loop, store, tiny_model):
    async def body():
        base = ChatSettings(system_prompt="", max_new_tokens=6, stop_on_loops=False)
        window, panes, bar = _compare_window(qtbot, await loaded_service(tiny_model), store, [
            replace_seed(base, 1), replace_seed(base, 2), replace(base, temperature=0.0)])
        bar.send("pick me")
        await wait_until(lambda: _done(panes), 60, "three replies")
        winner = panes[1]
        made = bar.branch_from(winner)
        assert len(made) == 2
        tiled = window.chats.tiled()
        assert tiled[0] is winner and [p.session.chat_id for p in tiled[1:]] == made
        winner_texts = [m.content for m in winner.session.messages]
        for cid, old in zip(made, (panes[0], panes[2])):
            new = window.chats.sessions[cid]
            assert [m.content for m in new.messages] == winner_texts  # continues from the winning reply
            assert new.settings == old.session.settings  # with that pane's own settings
        assert bar.panes == tiled
        bar.send("and next?")
        await wait_until(lambda: _done(tiled), 60, "replies after the branch")
        assert all(len(p.session.messages) == 4 for p in tiled)
        bar.continue_in(winner)
        assert window.chats.mode == "tabs" and window.chats.open_ids == [winner.session.chat_id]
        assert not bar.isVisible() and window.chats.current_pane() is winner
        await window.service.close()

    run(loop, body())


def replace(settings, **kw):
    from dataclasses import replace as r

    return r(settings, **kw)


def test_winner_entries_tell_same_titled_chats_apart(qtbot, store):
    """Four chats sent the same first message are all titled by it: each winner entry adds its tile's place
    (the entry's colour square is not read out), and a renamed chat's entry drops it once its title is its own."""
    window = make_window(qtbot, store)
    panes = [window.new_chat("Name three colours.") for _ in range(4)]
    window.chats.show_side_by_side(panes)
    window.chats.set_compare(True)
    bar = window.chats.compare
    entries = [bar.winner.itemText(i) for i in range(bar.winner.count())]
    assert entries == [f"Name three colours. ({place})" for place in
                       ("top left", "top right", "bottom left", "bottom right")], entries
    assert all(not bar.winner.itemIcon(i).isNull() for i in range(bar.winner.count()))  # the chat's colour
    bar.panes[0].session.rename("Colours")  # as the chat list or the pane's title does
    assert bar.winner.itemText(0) == "Colours" and bar.winner.itemText(1) == "Name three colours. (top right)"

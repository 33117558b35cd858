"""Chat features with real widgets and the tiny model through the real EngineService:
activity marks, Continue, regenerate keeping alternatives (‹1/3›), and branches that share prefix pages."""
from dataclasses import replace

import pytest
from PySide6.QtCore import QUrl

from app.core.store import ChatSettings
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(300)


def _click(pane, verb, message_id):
    pane._anchor(QUrl(f"pd:{verb}/{message_id}"))  # what clicking the link in the transcript does


def test_tabs_and_chat_list_mark_chats_that_are_generating(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat("busy")
        idle = window.new_chat("idle")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=300, seed=1, system_prompt=""))
        window.chats.tabs.setCurrentWidget(idle)
        states = []
        s.activity_changed.connect(states.append)
        pane.send("hello")
        await wait_until(lambda: s.activity == "streaming", 60, "streaming")
        i = window.chats.tabs.indexOf(pane)
        qtbot.waitUntil(lambda: "generating" in window.chats.tabs.tabToolTip(i), timeout=10_000)
        assert not window.chats.tabs.tabIcon(i).isNull()
        assert window.chat_list.activity(s.chat_id) == "streaming"
        item = window.chat_list.list.item(window.chat_list.ids().index(s.chat_id))
        assert "generating" in item.toolTip() and not item.icon().isNull()
        other = window.chat_list.list.item(window.chat_list.ids().index(idle.session.chat_id))
        assert other.icon().isNull()
        await wait_until(lambda: s.task.done(), 120, "the reply")
        assert states[0] == "queued" and "streaming" in states and states[-1] == ""
        assert window.chat_list.activity(s.chat_id) == "" and item.icon().isNull()
        assert "generating" not in window.chats.tabs.tabToolTip(window.chats.tabs.indexOf(pane))
        await window.service.close()

    run(loop, body())


def test_continue_extends_a_stopped_reply_and_regenerate_keeps_alternatives(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat("c")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=12, seed=7, system_prompt=""))
        pane.send("hello")
        await wait_until(lambda: s.task.done(), 60, "the reply")
        first = s.messages[-1]
        first_text = first.content
        assert first.stats.eos_reason == "max_new_tokens" and s.can_continue()
        assert pane.continue_action.isEnabled() and ("continue", "continue") in pane.transcript.bar_actions(first.id)
        pane.actions_bar.show_for(first.id)
        pane.actions_bar.buttons["continue"].click()  # the Continue button on the cut reply
        await wait_until(lambda: s.running, 10, "the continuation to start")
        await wait_until(lambda: not s.running, 60, "the continuation")
        cont = s.messages[-1]
        assert cont.id == first.id and cont.content.startswith(first_text) and len(cont.content) > len(first_text)
        assert cont.stats.new_tokens == 24 and store.messages(s.chat_id)[-1].content == cont.content

        pane.regenerate()
        await wait_until(lambda: s.running, 10, "the regeneration to start")
        await wait_until(lambda: not s.running, 60, "the regeneration")
        pane.regenerate()
        await wait_until(lambda: s.running, 10, "the regeneration to start")
        await wait_until(lambda: not s.running, 60, "the regeneration")
        third = s.messages[-1]
        assert s.alternatives(third.id) == [first.id, s.alternatives(third.id)[1], third.id]
        assert "3/3" in pane.view.toPlainText()
        _click(pane, "prev", third.id)
        _click(pane, "prev", s.messages[-1].id)
        assert s.messages[-1].id == first.id and s.messages[-1].content == cont.content
        assert "1/3" in pane.view.toPlainText() and [m.content for m in store.messages(s.chat_id)][-1] == cont.content
        await window.service.close()

    run(loop, body())


def _common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_a_branch_shares_its_prefix_pages_with_the_chat_it_came_from(qtbot, loop, store, tiny_model):
    """Branch from the first reply; both chats then answer: the branch's first reply reads the common prefix
    from the cache (cached tokens = the common prefix), and while both run the map shows those pages shared."""
    async def body():
        service = await loaded_service(tiny_model)
        window = make_window(qtbot, store, service)
        pane = window.new_chat("source")
        s = pane.session
        settings = ChatSettings(max_new_tokens=8, seed=2, system_prompt="Be brief.")
        s.set_settings(settings)
        pane.send("Tell me about " + "the harbour and the ships " * 50)  # > one 256-token page
        await wait_until(lambda: s.task.done(), 60, "the first reply")
        first_reply = s.messages[-1].id
        opened = []
        pane.branched.connect(opened.append)
        _click(pane, "branch", first_reply)
        assert len(opened) == 1 and window.chats.current_pane().session.chat_id == opened[0]
        b = window.chats.panes[opened[0]].session
        assert [m.content for m in b.messages] == [m.content for m in s.messages] and b.settings == s.settings
        assert b.chat.branch_of == first_reply and opened[0] in window.chat_list.ids()

        pane.send("And the lighthouse?")
        await wait_until(lambda: s.task.done(), 60, "the source's second reply")
        history = lambda sess: [{"role": m.role, "content": m.content} for m in sess.messages]  # noqa: E731
        source_prompt = service.prompt_ids(history(s)[:-1], settings)[0].tolist()
        window.chats.panes[opened[0]].send("And the fish market?")
        await wait_until(lambda: b.task.done(), 60, "the branch's first reply")
        branch_prompt = service.prompt_ids(history(b)[:-1], settings)[0].tolist()
        common = _common_prefix(source_prompt, branch_prompt)
        page = 256
        assert common >= page
        assert b.messages[-1].stats.cached_tokens == common  # the whole common prefix came from the cache

        # Both branches running at once: their common prefix pages are shared on the page map.
        long = ChatSettings(max_new_tokens=120, seed=3, system_prompt="Be brief.")
        s.set_settings(long)
        b.set_settings(long)
        window.chats.set_view("tiles", 2)
        shared_seen = []

        def look(snap):
            owners = set(snap["page_owner_identifiers"].values())
            if {s.chat_id, b.chat_id} <= {int(o) for o in owners} and any(snap["page_shared"]):
                shared_seen.append(window.dashboard.page_map.pages.shared.any())

        service.metrics.connect(look)
        await s.regenerate()
        await b.regenerate()
        await wait_until(lambda: s.task.done() and b.task.done(), 120, "both replies")
        assert shared_seen and any(shared_seen), "no snapshot showed the shared prefix pages while both ran"
        await service.close()

    run(loop, body())


def test_long_chat_titles_are_elided_with_the_full_title_in_the_tooltip(qtbot, store):  # noqa: F811
    from app.chat.chat_list import ChatList

    chats = ChatList(store)
    qtbot.addWidget(chats)
    long_title = "A very long question about the history of the Roman empire and its roads " * 2
    chats.new_chat("Short")
    chats.new_chat(long_title)
    chats.resize(220, 300)
    chats.show()
    qtbot.waitExposed(chats)
    view = chats.list
    item = view.item(chats.titles().index(" ".join(long_title.split())))
    assert item.toolTip() == item.text() and item.text().startswith("A very long question")
    assert view.horizontalScrollBar().maximum() == 0 and not view.horizontalScrollBar().isVisible()
    assert view.visualItemRect(item).width() <= view.viewport().width()  # drawn elided, not clipped
    chats.set_activity(store.chats()[0].id, "streaming")  # an icon row keeps the list's width too
    assert view.horizontalScrollBar().maximum() == 0


def test_a_reply_stuck_repeating_itself_is_stopped_and_says_so(qtbot, loop, store, tiny_model, monkeypatch):  # noqa: F811
    """The chats' loop guard (on by default) ends a looping reply; the pane's state and the stats line say
    why. A random tiny model never repeats itself: a bias on one token makes it loop on that token (with DRY
    off, which would soon outweigh the bias)."""
    sampler = ChatSettings.sampler_settings
    monkeypatch.setattr(ChatSettings, "sampler_settings", lambda self: replace(sampler(self), token_bias={700: 1e4}))

    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat("loops")
        s = pane.session
        assert s.settings.stop_on_loops
        s.set_settings(replace(s.settings, max_new_tokens=300, seed=1, system_prompt="", dry_multiplier=0.0))
        pane.send("hello")
        await wait_until(lambda: s.task is not None and s.task.done(), 120, "the reply")
        reply = store.messages(s.chat_id)[-1]
        assert (reply.stats.state, reply.stats.eos_reason, reply.stats.new_tokens) == ("done", "repetition", 48)
        assert pane.state.text() == "stopped: repeating itself"
        assert "stopped: repeating itself · " in pane.view.toPlainText()
        await window.service.close()

    run(loop, body())

"""Small things a user meets first: a reply without adapters says "no LoRA" (in its stats line and the compare
chip), the compare bar's chat names stay readable (whole, or elided in the middle with the whole name in the
tooltip) and follow renames and first-message titles live, and View > "Tiles: N" shows N panes even when
fewer chats are open."""
import pytest
from PySide6.QtWidgets import QApplication

from app.core.store import ChatSettings, ReplyStats
from tests.app.support import (  # noqa: F401
    loaded_service, loop, make_window, run, store, tiny_model, visible_panes, wait_until,
)

pytestmark = pytest.mark.timeout(240)


def settle():
    for _ in range(5):
        QApplication.processEvents()


def test_a_reply_without_adapters_says_no_lora(qtbot, store):
    from app.core.formatting import stats_text
    from app.window.compare_bar import settings_summary

    stats = ReplyStats(state="done", prompt_tokens=12, new_tokens=3, adapters="[]")
    assert stats_text(stats).endswith("· no LoRA")
    assert settings_summary(ChatSettings(loras=())).endswith("· no LoRA")

    window = make_window(qtbot, store)  # and in a pane's transcript, under the reply
    pane = window.new_chat("stats")
    store.add_message(pane.session.chat_id, "user", "hi")
    store.add_message(pane.session.chat_id, "assistant", "hello", stats=stats)
    pane.session.reload()
    text = pane.view.toPlainText()
    assert "no LoRA" in text and "base model" not in text


def test_compare_names_follow_renames_and_first_message_titles(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        window.resize(1700, 900)  # room for a short title to show whole
        panes = [window.new_chat() for _ in range(3)]
        for pane in panes:
            pane.session.set_settings(ChatSettings(max_new_tokens=2, stop_on_loops=False))
        window.chats.show_side_by_side(panes)
        window.chats.set_compare(True)
        bar = window.chats.compare
        settle()
        first, second, third = (p.session.chat_id for p in panes)

        # a rename in the chat list: the chip and the winner list follow at once
        window.chat_list.rename(first, "Pirate captain")
        assert bar.checks[first].name() == "Pirate captain" and bar.checks[first].text() == "Pirate captain"
        assert bar.winner.itemText(bar.winner.findData(first)) == "Pirate captain"

        # a long title: elided in the middle (its start and its end both show), the whole in the tooltip
        long = "Write a limerick about a harbour cat who steals fish from the morning boats"
        window.chat_list.rename(second, long)
        settle()
        check = bar.checks[second]
        shown = check.text()
        assert "…" in shown and shown.startswith("Write") and shown.endswith(long[-3:]), shown
        assert check.toolTip() == long and long in check.accessibleName()
        assert check.fontMetrics().horizontalAdvance(shown) <= check.width()

        # a chat titled by its first message (sent from the compare bar to the third pane only)
        bar.checks[first].setChecked(False)
        bar.checks[second].setChecked(False)
        bar.send("How far is the lighthouse from the pier?")
        await wait_until(lambda: not panes[2].session.running, 120, "the reply")
        title = store.chat(third).title
        assert title.startswith("How far is the lighthouse")
        assert bar.checks[third].name() == title
        assert bar.winner.itemText(bar.winner.findData(third)) == title
        await window.service.close()

    run(loop, body())


@pytest.mark.parametrize("tiles", [2, 3, 4])
def test_tiles_n_opens_chats_to_fill_n_panes(qtbot, store, tiles):
    window = make_window(qtbot, store)
    window.new_chat()
    assert len(window.chats.open_ids) == 1
    window.view_actions[("tiles", tiles)].trigger()
    settle()
    assert len(visible_panes(window)) == tiles
    assert len(store.chats()) == tiles  # new chats, each in its own pane
    window.view_actions[("tabs", 2)].trigger()
    window.view_actions[("tiles", 2)].trigger()  # fewer tiles than open chats: nothing new
    assert len(store.chats()) == tiles

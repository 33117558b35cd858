"""The message queue on a real generator (tiny random model) and a real window: a message sent while its
chat replies waits, is sent when the reply ends, can be edited or cancelled, and survives a restart."""
import pytest
from PySide6.QtCore import Qt

from app.core.store import ChatSettings, Store
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(240)


def _users(session) -> list[str]:
    return [m.content for m in session.messages if m.role == "user"]


def test_a_message_sent_while_replying_is_queued_then_sent(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat("queue")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=60, seed=1, system_prompt=""))
        pane.send("first")
        assert s.running
        for text in ("second", "third", "fourth"):
            qtbot.keyClicks(pane.prompt, text)
            qtbot.keyClick(pane.prompt, Qt.Key.Key_Return)
        assert not pane.error.isVisible(), pane.error.text()  # not refused
        assert [q.content for q in s.queued()] == ["second", "third", "fourth"]
        assert pane.queue_list.isVisible() and len(pane.queue_list.rows) == 3
        assert _users(s) == ["first"]
        # edit the second queued message through its Edit button and the prompt box
        item, edit, _cancel = pane.queue_list.rows[1]
        edit.click()
        assert pane.prompt.toPlainText() == "third" and pane.banner.isVisible()
        pane.prompt.clear()
        qtbot.keyClicks(pane.prompt, "third, edited")
        qtbot.keyClick(pane.prompt, Qt.Key.Key_Return)
        # cancel the last one
        pane.queue_list.rows[2][2].click()
        assert [q.content for q in s.queued()] == ["second", "third, edited"]
        await wait_until(lambda: len(_users(s)) == 3 and not s.running and not s.queued(), 180, "the queue to drain")
        assert _users(s) == ["first", "second", "third, edited"]
        replies = [m for m in s.messages if m.role == "assistant"]
        assert len(replies) == 3 and all(r.stats.state == "done" for r in replies)
        assert not pane.queue_list.isVisible()
        await window.service.close()

    run(loop, body(), 220)


def test_stop_sends_the_next_queued_message(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat("stop and go on")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=400, stop_on_loops=False))
        pane.send("long one")
        pane.send("next")
        assert [q.content for q in s.queued()] == ["next"]
        await wait_until(lambda: s.live(s.messages[-1].id) and s.live(s.messages[-1].id)[1].new_tokens >= 3,
                         what="streaming")
        qtbot.keyClick(pane.prompt, Qt.Key.Key_Escape)
        await wait_until(lambda: _users(s) == ["long one", "next"], 60, "the queued message after the stop")
        assert s.messages[1].stats.state == "stopped" and not s.queued()
        await s.stop()
        await window.service.close()

    run(loop, body())


def test_the_queue_survives_a_restart(qtbot, loop, tmp_path, tiny_model):
    """Queued messages are in the database: the window closes while the chat replies (its queue waits),
    a new window on the same store file shows them and sends them, in order."""
    async def body():
        store = Store.open(tmp_path / "data")
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat("restart")
        chat_id = pane.session.chat_id
        pane.session.set_settings(ChatSettings(max_new_tokens=400, seed=3, system_prompt="", stop_on_loops=False))
        window.chats.set_view("tabs")
        pane.send("before the restart")
        pane.send("queued A")
        pane.send("queued B")
        await window.shutdown()  # stops the reply, closes the generator and the store
        assert store.closed

        store2 = Store.open(tmp_path / "data")
        window2 = make_window(qtbot, store2, await loaded_service(tiny_model))
        pane2 = window2.chats.open_chat(chat_id)
        s2 = pane2.session
        assert _users(s2) == ["before the restart"]
        await wait_until(lambda: _users(s2) == ["before the restart", "queued A", "queued B"] and not s2.running,
                         180, "the restored queue to be sent")
        assert not s2.queued()
        await window2.service.close()
        store2.close()

    run(loop, body(), 220)

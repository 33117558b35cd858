"""A chat that outgrows the tiny model's 512-token context, with real widgets: in truncate-middle mode (the
default) it keeps answering, its prompt keeping the first turn and the latest ones, and the pane says how
many turns it left out; in stop-at-limit mode the reply stops when the context is full and the pane says
so and what to do. The mode is set in the chat settings dialog and stored with the chat."""
from __future__ import annotations

from app.core.context_window import STOP_AT_LIMIT, TRUNCATE_MIDDLE
from app.core.store import ChatSettings, ReplyStats, Store
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

LIMIT = 512


def as_prompt(messages) -> list[dict]:
    return [{"role": m.role, "content": m.content} for m in messages]


def choose_mode(qtbot, pane, label: str) -> None:
    """The chat settings dialog, as the pane's Settings… opens it: the overflow mode picked, the dialog's
    settings given to the chat (what accepting it does)."""
    from app.panels.settings_dialog import SettingsDialog

    dlg = SettingsDialog(pane.session.settings, "Settings", pane)
    qtbot.addWidget(dlg)
    dlg.context_overflow.setCurrentIndex(dlg.context_overflow.findText(label))
    pane.session.set_settings(dlg.settings())


def test_truncate_middle_keeps_answering_and_says_what_it_left_out(qtbot, loop, store, tiny_model):
    async def body():
        service = await loaded_service(tiny_model)
        pane = make_window(qtbot, store, service).new_chat("long")
        s = pane.session
        s.set_settings(ChatSettings(system_prompt="You are terse.", max_new_tokens=40, seed=4, stop_on_loops=False))
        assert s.settings.context_overflow == TRUNCATE_MIDDLE  # the default
        choose_mode(qtbot, pane, "Stop at limit")
        choose_mode(qtbot, pane, "Truncate middle")  # picked in the dialog, stored with the chat
        again = Store(store.path)
        assert again.chat(s.chat_id).settings.context_overflow == TRUNCATE_MIDDLE
        again.close()
        s.store.add_message(s.chat_id, "user", "the task: " + "alpha beta " * 5)  # the opening turn: short
        s.store.add_message(s.chat_id, "assistant", "understood", ReplyStats(state="done"))
        for i in range(5):
            s.store.add_message(s.chat_id, "user", f"question {i}: " + "gamma delta " * 25)
            s.store.add_message(s.chat_id, "assistant", f"answer {i}: " + "one two " * 15, ReplyStats(state="done"))
        s.reload()
        assert service.context_limit() == LIMIT
        assert service.count_tokens(as_prompt(s.messages), s.prompt_settings()) > LIMIT - 40
        for n in range(3):  # the chat keeps answering, each reply within the context
            stored = len(s.messages)
            pane.send(f"follow-up {n}")
            await wait_until(lambda: s.task is not None and s.task.done(), 120, "the reply")
            reply = s.messages[-1]
            assert reply.stats.state == "done" and reply.stats.error is None, reply.stats
            assert len(s.messages) == stored + 2  # nothing taken out of the chat itself
            d = reply.stats.dropped_turns
            assert d >= 1 and reply.stats.dropped_messages == 2 * d
            history = as_prompt(s.messages[:-1])
            kept = history[:2] + history[2 + 2 * d:]  # the opening turn and the latest ones; the middle gone
            assert reply.stats.prompt_tokens == service.count_tokens(kept, s.prompt_settings())
            assert service.count_tokens(history[2 * d:], s.prompt_settings()) != reply.stats.prompt_tokens
            assert reply.stats.prompt_tokens + reply.stats.new_tokens <= LIMIT
            assert f"{d} turn{'s' if d > 1 else ''} left out of the prompt" in pane.meter.text()
        again = Store(store.path)
        assert [m.content for m in again.messages(s.chat_id)] == [m.content for m in s.messages]  # history intact
        assert again.messages(s.chat_id)[-1].stats.dropped_turns == d
        again.close()
        await service.close()

    run(loop, body(), timeout=400)


def test_stop_at_limit_stops_when_the_context_is_full_and_says_what_to_do(qtbot, loop, store, tiny_model):
    async def body():
        service = await loaded_service(tiny_model)
        pane = make_window(qtbot, store, service).new_chat("full")
        s = pane.session
        s.set_settings(ChatSettings(system_prompt="", seed=3, stop_on_loops=False))  # no limit: until it is full
        choose_mode(qtbot, pane, "Stop at limit")
        assert s.settings.context_overflow == STOP_AT_LIMIT
        s.store.add_message(s.chat_id, "user", "start")
        s.store.add_message(s.chat_id, "assistant", "ok", ReplyStats(state="done"))
        s.reload()
        text = "fill"
        while service.count_tokens(as_prompt(s.messages) + [{"role": "user", "content": text + " alpha"}],
                                   s.prompt_settings()) < LIMIT - 4:
            text += " alpha"  # the next message leaves 2-4 tokens of room
        pane.send(text)
        await wait_until(lambda: s.task is not None and s.task.done(), 120, "the reply")
        reply = s.messages[-1]
        assert reply.stats.dropped_turns == 0  # nothing left out
        assert reply.stats.prompt_tokens + reply.stats.new_tokens == LIMIT  # it ran until the context was full
        assert "the context is full" in reply.stats.error and "Context overflow" in reply.stats.error
        assert "the context is full" in pane.view.toPlainText()
        assert "Truncate middle" in pane.view.toPlainText()  # what to do

        pane.send("and more?")  # no room at all: the message at once, no reply tokens
        await wait_until(lambda: s.task is not None and s.task.done(), 120, "the refused reply")
        refused = s.messages[-1]
        assert refused.stats.state == "error" and refused.stats.new_tokens == 0
        assert refused.stats.error.startswith("the context is full") and "Context overflow" in refused.stats.error
        assert f"context of {LIMIT} tokens" in refused.stats.error
        assert pane.view.toPlainText().count("the context is full") == 2

        choose_mode(qtbot, pane, "Rolling window")  # what the message suggests: the chat answers again
        await s.regenerate()
        await wait_until(lambda: s.task.done(), 120, "the reply after switching")
        assert s.messages[-1].stats.state == "done" and s.messages[-1].stats.dropped_turns >= 1
        await service.close()

    run(loop, body(), timeout=400)

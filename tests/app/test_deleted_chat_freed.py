"""A deleted chat leaves nothing behind: its session (with every message it read), its pane and the pane's
transcript go, whether the chat was idle or still replying when deleted.

The app soak found the session kept: a child of the chat area that nothing deleted, holding its messages
and, through its signals' connections, the pane's Python side (transcript, buttons): one Qt object and
~14 wrappers per deleted chat, and the chat's whole history, for as long as the window lived.
"""
import asyncio
import gc
import weakref

import pytest

from app.core.store import ChatSettings
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(120)


async def settle() -> None:
    for _ in range(3):  # deleteLater()s, then what they released
        await asyncio.sleep(0.02)
        gc.collect()


def test_a_deleted_chat_frees_its_session_pane_and_transcript(qtbot, loop, store, tiny_model):
    from app.chat.chat_session import ChatSession

    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        settings = ChatSettings(max_new_tokens=4, seed=1)
        refs, kept_before = [], len(win.findChildren(ChatSession))
        for running in (False, True):
            pane = win.new_chat("to delete")
            pane.session.set_settings(settings)
            pane.session.send("hi")
            if not running:
                await wait_until(lambda: not pane.session.running, 60, "the reply")
            else:
                await wait_until(lambda: pane.session.running, 10, "the reply to start")
            refs += [weakref.ref(pane.session), weakref.ref(pane), weakref.ref(pane.session.messages[0])]
            win.chat_list.delete([pane.session.chat_id])
            del pane
            await settle()
            await wait_until(lambda: not win.service.running, 30, "the cancelled reply to end")
            await settle()
        assert len(win.findChildren(ChatSession)) == kept_before
        assert [r() for r in refs] == [None] * len(refs)
        await win.service.close()

    run(loop, body())

"""Reply ranks in a real window on a real generator (tiny random model, a three-page cache): the chat the user
looks at keeps its pages. Two chats stream more than the cache holds; moving the focus to the later one makes
the earlier one the reply that gives its pages back, and the dashboard counts it under that chat."""
import pytest

from app.core.priorities import BAND, KINDS, Priorities, check_order
from app.core.store import ChatSettings
from app.preferences.preferences import Preferences
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(300)

LONG = ChatSettings(max_new_tokens=300, temperature=0.0, stop_on_loops=False)


def job_of(service, chat_id):
    job = service._jobs.get(chat_id)
    return job.job if job is not None else None


def test_focusing_a_chat_makes_the_other_one_give_its_pages_back(qtbot, loop, store, tiny_model):
    async def body():
        service = await loaded_service(tiny_model, cache_tokens=3 * 256)  # two replies of two pages: four
        window = make_window(qtbot, store, service)
        a, b = window.new_chat(), window.new_chat()
        for pane in (a, b):
            pane.session.set_settings(LONG)
        a.send("Tell a long story about rivers.")
        b.send("Tell a long story about mountains.")
        await wait_until(lambda: all(job_of(service, p.session.chat_id) is not None and
                                     job_of(service, p.session.chat_id).new_tokens > 0 for p in (a, b)),
                         what="both replies streaming")
        ja, jb = job_of(service, a.session.chat_id), job_of(service, b.session.chat_id)
        window.chats.tabs.setCurrentWidget(a)  # the user looks at A: it ranks first from the next step
        await wait_until(lambda: ja.priority < jb.priority, what="A ranked first")
        assert ja.preemptions == jb.preemptions == 0  # neither has outgrown its first page yet
        window.chats.tabs.setCurrentWidget(b)  # then picks B's tab
        await wait_until(lambda: ja.preemptions > 0 or jb.preemptions > 0, timeout=120, what="a preemption")
        assert ja.priority > jb.priority and jb.preemptions == 0
        await wait_until(lambda: not a.session.running and not b.session.running, timeout=200, what="both replies")
        assert jb.preemptions == 0 and ja.preemptions > 0 and ja.resumes == ja.preemptions
        assert [p.session.messages[-1].stats.new_tokens for p in (a, b)] == [300, 300]
        table = window.dashboard.page_map.preemptions
        want = {a.session.chat_id: (ja.preemptions, ja.resumes, ja.recomputed_tokens)}
        # the dashboard hears of the preemption and of the resume in separate samples: wait for both
        await wait_until(lambda: table.per_chat() == want, what="the dashboard's counts")
        counts = table.per_chat()
        assert counts == want
        assert table.isVisibleTo(window.dashboard) and table.rowCount() == 1
        assert table.item(0, 0).text() == a.session.chat.title and table.item(0, 1).text() == str(ja.preemptions)
        await service.close()

    run(loop, body(), timeout=300)


def test_the_order_is_the_users(tmp_path, monkeypatch):
    prefs = Preferences(tmp_path / "p.ini")
    assert prefs.reply_order == KINDS
    order = ("batch", "focused", "api", "chats", "extras")
    prefs.reply_order = order
    assert Preferences(tmp_path / "p.ini").reply_order == order
    with pytest.raises(ValueError, match="each of"):
        prefs.reply_order = ("focused", "chats")
    p = Priorities(order)
    p.focus(7, compared=[7, 8])
    assert [p.priority(i) for i in (("batch", 1, 0), 7, 9, 8, (7, 1))] == [-2 * BAND, -BAND, BAND, 2 * BAND, 2 * BAND]
    assert p.of_kind("api") == 0  # API requests keep their client's own priority around 0
    with pytest.raises(ValueError):
        check_order(KINDS + ("focused",))


def test_the_preferences_dialog_changes_the_order_and_says_where_it_does_not_apply(qtbot, loop, store):
    from app.core.remote_backend import RemoteBackend

    async def body():
        window = make_window(qtbot, store)
        dlg = window.open_preferences()
        qtbot.addWidget(dlg)
        order = dlg.reply_order
        assert order.order() == KINDS and not order.note.isVisibleTo(dlg)
        order.list.setCurrentRow(KINDS.index("api"))
        for _ in range(3):
            order.up.click()  # API requests right after the focused chat
        dlg.accept()
        assert Preferences().reply_order == ("focused", "api", "chats", "extras", "batch")
        assert window.service.priorities.order == Preferences().reply_order  # the next reply's rank uses it
        window.backend.use(RemoteBackend("http://127.0.0.1:9"))
        assert not window.backend.ranks_replies
        dlg = window.open_preferences()
        qtbot.addWidget(dlg)
        assert dlg.reply_order.note.isVisibleTo(dlg) and "remote server" in dlg.reply_order.note.text()
        dlg.reject()
        Preferences().reply_order = KINDS

    run(loop, body())


def test_a_new_order_reaches_the_replies_already_running(qtbot, loop, store, tiny_model):
    async def body():
        service = await loaded_service(tiny_model)
        window = make_window(qtbot, store, service)
        pane = window.new_chat()
        pane.session.set_settings(LONG)
        pane.send("Tell a long story about lakes.")
        chat = pane.session.chat_id
        await wait_until(lambda: job_of(service, chat) is not None and job_of(service, chat).new_tokens > 0,
                         what="the reply streaming")
        job = job_of(service, chat)
        assert job.priority == Priorities().of_kind("focused")
        dlg = window.open_preferences()
        qtbot.addWidget(dlg)
        dlg.reply_order.list.setCurrentRow(0)
        for _ in range(4):
            dlg.reply_order.down.click()  # the focused chat last, after API requests
        dlg.accept()
        await wait_until(lambda: job.priority == BAND, what="the running reply re-ranked")
        Preferences().reply_order = KINDS
        await service.close()

    run(loop, body())

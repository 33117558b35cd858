""""N replies at once" in a real window on a real generator (tiny random model): one action makes N
versions of the reply, run together; seeded versions differ (seed + i), version 1 equals the single reply."""
import pytest

from app.core.store import ChatSettings
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(240)


def test_three_replies_become_three_versions(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat()
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=10, seed=5, temperature=1.0))
        pane.send("Name three rivers.")
        await wait_until(lambda: not s.running and s.messages[-1].stats.state == "done", what="single reply")
        single = s.messages[-1]
        menu = pane.more_btn.menu()
        sub = next(a.menu() for a in menu.actions() if a.text() == "N replies at once")
        action = next(a for a in sub.actions() if a.text() == "3 replies")
        action.trigger()
        await wait_until(lambda: s.running, what="the replies to start")
        await wait_until(lambda: not s.running, what="all three replies")
        shown = s.messages[-1]
        versions = s.alternatives(shown.id)
        assert len(versions) == 4 and versions[0] == single.id  # the earlier reply, then the three new ones
        new = [window.store.message(v) for v in versions[1:]]
        assert shown.id == new[0].id  # version 1 of the three is shown
        assert all(m.stats.state == "done" and m.stats.new_tokens >= 1 for m in new)
        assert new[0].content == single.content  # same seed, same history
        assert len({m.content for m in new}) == 3  # seeds 5, 6, 7
        assert "2/4" in pane.view.toPlainText()
        assert pane.session.select_alternative(shown.id, +1) == new[1].id
        assert s.messages[-1].content == new[1].content
        await window.service.close()

    run(loop, body())

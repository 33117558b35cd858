"""Every chat pane's start page and context meter follow the model the app loaded: the pane open while it
loads and the panes made afterwards for new tiles alike (a tile's pane named no model, offering "Choose a
model…", and the first pane's meter stayed blank)."""
import pytest

from tests.app.support import TINY_CACHE_TOKENS, loop, make_window, run, store, tiny_model, visible_panes  # noqa: F401

pytestmark = pytest.mark.timeout(240)


def test_every_pane_names_the_loaded_model_and_its_context(qtbot, loop, store, tiny_model):
    async def body():
        win = make_window(qtbot, store)
        win.new_chat()
        assert await win.loader.load_model({"path": str(tiny_model), "cache_tokens": TINY_CACHE_TOKENS})
        win.view_actions[("tiles", 4)].trigger()  # three more panes, made after the load
        panes = visible_panes(win)
        assert len(panes) == 4
        for pane in panes:
            state = pane.empty_state
            assert state.isVisible() and state.model_btn.text() == "Switch model…", state.model_btn.text()
            assert tiny_model.name in state.model_label.text()
            limit = pane.session.backend.context_limit(pane.session.settings)
            assert limit and pane.meter.text().endswith(f" / {limit} tok"), repr(pane.meter.text())
        await win.service.close()

    run(loop, body())

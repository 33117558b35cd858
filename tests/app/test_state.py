"""Layout and state restored across restarts: window geometry and docks, view mode, open chats,
the active LoRA set, the model panel's options and the last model, kept by app.core.state in an INI file whose
location the test chooses (state_path)."""
import asyncio

import pytest
from PySide6.QtCore import Qt

from app.window.main_window import MainWindow
from tests.app.support import TINY_CACHE_TOKENS, loop, run, store, tiny_model, wait_until  # noqa: F401
from tests.engine.test_async_api import write_adapter

pytestmark = pytest.mark.timeout(240)


def window(qtbot, store, state_path):
    win = MainWindow(store, state_path=state_path)
    qtbot.addWidget(win)
    win.show()
    return win


@pytest.fixture
def app_keeps_running(qapp):
    """As in the app (app.__main__): closing the window must not stop the loop before shutdown."""
    before = qapp.quitOnLastWindowClosed()
    qapp.setQuitOnLastWindowClosed(False)
    yield
    qapp.setQuitOnLastWindowClosed(before)


def test_a_restart_looks_like_the_last_session(qtbot, loop, store, tiny_model, tmp_path, app_keeps_running):
    state = tmp_path / "config" / "state.ini"
    adapters = tmp_path / "loras"
    write_adapter(adapters / "tiny-pirate")

    async def first_session():
        win = window(qtbot, store, state)
        assert await win.loader.load_model({"path": str(tiny_model), "cache_tokens": TINY_CACHE_TOKENS, "use_ngram": True})
        win.lora_panel.add_folder(adapters)
        win.lora_panel.set_selection({"tiny-pirate": 0.75})
        win.lora_panel.apply_button.click()
        await wait_until(lambda: win.lora_panel.active_label.text() == "Default LoRA: tiny-pirate", what="the LoRA")
        ids = [win.new_chat(f"chat {i}").session.chat_id for i in range(4)]
        win.chats.close_chat(ids[1])
        win.chats.open_chat(ids[2])
        win.chats.set_view("tiles", 3)
        win.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, win.dock("Chats"))  # the user moved a dock
        win.dock("Server").close()
        win.resize(780, 600)  # the offscreen screen is 800x800; a fresh start fills it
        size = (win.width(), win.height())
        assert size[1] == 600
        win.model_panel.kv_combo.setCurrentIndex(win.model_panel.kv_combo.count() - 1)  # chosen, not loaded
        options = win.model_panel.request()
        win.close()
        await win.service.close()
        return ids, options, size

    ids, options, size = run(loop, first_session())
    assert state.is_file()

    async def second_session():
        win = window(qtbot, store, state)
        # three tiles keep 250 px each, so the first window grew wider than the 800 px offscreen screen: a
        # restored window is kept on the screen (the height, unlike a fresh start's, is the user's)
        available = win.screen().availableGeometry().width()
        assert win.height() == size[1]
        assert win.width() == size[0] if size[0] <= available else win.width() <= available
        assert win.dockWidgetArea(win.dock("Chats")) == Qt.DockWidgetArea.RightDockWidgetArea
        assert not win.dock("Server").isVisible() and win.dashboard.isVisible()
        assert (win.chats.mode, win.chats.tile_count) == ("tiles", 3) and win.view_actions[("tiles", 3)].isChecked()
        assert win.model_panel.request() == options
        assert str(adapters.resolve()) in win.lora_panel.folders()  # the folder the user added is scanned again
        await win.restore_session()
        assert win.chats.open_ids == [ids[0], ids[2], ids[3]] and win.chats.current_pane().session.chat_id == ids[2]
        assert win.service.info["path"] == str(tiny_model) and win.service.info["cache_tokens"] == TINY_CACHE_TOKENS
        assert win.service.request["use_ngram"] is True
        assert win.service.chat_loras == ((str(adapters / "tiny-pirate"), 0.75),)
        assert win.service.snapshot()["loras"] == ["tiny-pirate"]
        assert win.lora_panel.active_label.text() == "Default LoRA: tiny-pirate"
        await win.service.close()

    run(loop, second_session())


def test_a_damaged_state_file_means_defaults(qtbot, loop, store, tmp_path):
    state = tmp_path / "state.ini"
    state.write_text("[General]\nview={not json\nchats=\"[1, 2\"\nwindow\\placement=[1, 2]\n"
                     "model\\last=42\nlora\\active=[[1, 2, 3]]\n")
    win = window(qtbot, store, state)
    assert (win.chats.mode, win.chats.tile_count) == ("tabs", 2)
    assert win.state.chats() == ([], None) and win.state.loras() == [] and win.state.last_model() is None
    assert win.loader.load_request == {}
    screen = win.screen().availableGeometry()
    assert win.width() <= screen.width() and win.height() <= screen.height()


def test_the_app_reopens_with_the_last_model_and_chats(qtbot, loop, tiny_model, tmp_path, app_keeps_running):
    """app.__main__.run as `pagedeck` runs it: the second start names no model and gets the first one's."""
    from PySide6.QtWidgets import QApplication

    from app.__main__ import parse_args
    from app.__main__ import run as run_app

    data = tmp_path / "data"

    async def session(argv, act):
        before = set(QApplication.topLevelWidgets())
        app_run = asyncio.ensure_future(run_app(parse_args(argv)))
        await wait_until(lambda: any(isinstance(w, MainWindow) for w in set(QApplication.topLevelWidgets()) - before),
                         what="the window")
        win = next(w for w in set(QApplication.topLevelWidgets()) - before if isinstance(w, MainWindow))
        qtbot.addWidget(win)
        await wait_until(lambda: win.service.generator is not None and win.chats.open_ids, 120, "the model and a chat")
        result = act(win)
        win.close()
        assert await asyncio.wait_for(app_run, 60) == 0
        return result

    def first(win):
        win.new_chat("second chat")
        return [win.chats.sessions[i].chat.title for i in win.chats.open_ids]

    titles = run(loop, session(["--data-dir", str(data), "--model", str(tiny_model),
                                "--cache-tokens", str(TINY_CACHE_TOKENS)], first))
    assert titles == ["New chat", "second chat"]
    reopened = run(loop, session(["--data-dir", str(data)],
                                 lambda win: ([win.chats.sessions[i].chat.title for i in win.chats.open_ids], dict(win.service.info))))
    assert reopened[0] == titles
    assert reopened[1]["path"] == str(tiny_model) and reopened[1]["cache_tokens"] == TINY_CACHE_TOKENS


def test_a_window_at_the_top_of_a_frameless_screen_comes_back_where_it_was(qtbot, tmp_path, store):  # noqa: F811
    """Offscreen Qt has no window manager: a window saved at the screen's top, as tall as the screen, comes back
    at the same place and size (QWidget.restoreGeometry put it a guessed title bar, ~25 px, lower)."""
    state = tmp_path / "state.ini"
    win = window(qtbot, store, state)
    available = win.screen().availableGeometry()
    frame = win.frameGeometry().size() - win.geometry().size()
    win.resize(700, available.height() - frame.height())
    win.move(available.topLeft())
    saved = (win.pos(), win.size())
    win.save_state()
    again = window(qtbot, store, state)
    assert (again.pos(), again.size()) == saved
    assert available.contains(again.frameGeometry())

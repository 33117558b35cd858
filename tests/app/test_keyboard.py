"""The window driven by the keyboard alone (QTest key clicks on the focused widget, real generator on a tiny
model): three chats in three tiles, one message sent to all, one reply stopped, the model switched, every
dock opened; the command palette finds every menu command and runs it; Help > Keyboard shortcuts lists the
same commands with the keys that really trigger them."""
import asyncio
import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QDockWidget

from tests.app.support import (  # noqa: F401
    loaded_service, loop, make_window, run, store, tiny_model, visible_panes, wait_until,
)

pytestmark = pytest.mark.timeout(300)
CTRL, SHIFT, ALT = (Qt.KeyboardModifier.ControlModifier, Qt.KeyboardModifier.ShiftModifier,
                    Qt.KeyboardModifier.AltModifier)


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("kb") / "second-model", arch="qwen2", seed=5)


def key(qtbot, k, mods=Qt.KeyboardModifier.NoModifier):
    """A key press where the keyboard focus is now, as a user's."""
    target = QApplication.focusWidget() or QApplication.activeWindow()
    assert target is not None, "no window is active"
    qtbot.keyClick(target, k, mods)  # (shortcuts run synchronously; the loop runs the rest when awaited)


def type_text(qtbot, text):
    qtbot.keyClicks(QApplication.focusWidget(), text)


async def palette_run(qtbot, window, words):
    key(qtbot, Qt.Key.Key_K, CTRL)
    await wait_until(lambda: window.palette.search.hasFocus(), 10, "the palette's search box")
    assert window.palette.isVisible() and window.palette.search.hasFocus()
    type_text(qtbot, words)
    key(qtbot, Qt.Key.Key_Return)


def test_a_keyboard_only_session(qtbot, loop, store, tiny_model, second_model):
    async def body():
        service = await loaded_service(tiny_model)
        window = make_window(qtbot, store, service)
        window.model_panel.recent.add(str(second_model))  # a model used before: Ctrl+M offers it
        window.model_panel._refresh_recent()
        window.activateWindow()
        await wait_until(lambda: QApplication.activeWindow() is window, 10, "the window active")
        window.chat_list.list.setFocus()  # where a user starts: the chat list

        key(qtbot, Qt.Key.Key_N, CTRL)  # a chat; then three tiles, from the palette
        await palette_run(qtbot, window, "tiles 3")
        await asyncio.sleep(0.05)
        panes = visible_panes(window)
        assert len(panes) == 3 and window.chats.mode == "tiles"
        for n, pane in enumerate(panes):  # (set-up, not the user's: short replies, each pane its own prompt)
            pane.session.set_settings(pane.session.settings.__class__(
                system_prompt=f"You are harbour guide number {n}.", max_new_tokens=4, seed=1, stop_on_loops=False))

        key(qtbot, Qt.Key.Key_L, CTRL)  # into the current chat's message box
        await wait_until(lambda: any(p.prompt.hasFocus() for p in panes), 10, "a message box focused")
        assert any(p.prompt.hasFocus() for p in panes)
        release = threading.Event()  # hold the generator so the replies wait, to be stopped by key
        held = asyncio.ensure_future(service.generator.run_on_worker(lambda g: release.wait(60)))
        await asyncio.sleep(0)
        type_text(qtbot, "Name a harbour bird.")
        key(qtbot, Qt.Key.Key_Return, CTRL | SHIFT)  # send to all
        await asyncio.sleep(0.05)
        await wait_until(lambda: all(p.session.running for p in panes), 30, "three replies under way")
        assert all(p.session.messages[0].content == "Name a harbour bird." for p in panes)

        first = window.chats.current_pane()
        key(qtbot, Qt.Key.Key_PageDown, CTRL)  # the next pane ...
        await asyncio.sleep(0.05)
        stopped = window.chats.current_pane()
        assert stopped is not first and stopped.prompt.hasFocus()
        key(qtbot, Qt.Key.Key_Period, CTRL)  # ... stop its reply (before it got a token)
        await asyncio.sleep(0.05)
        release.set()
        await held
        others = [p for p in panes if p is not stopped]
        await wait_until(lambda: not any(p.session.running for p in panes), 120, "the replies and the stop")
        assert stopped.session.messages[-1].stats.state == "stopped"
        assert all(p.session.messages[-1].stats.state == "done" for p in others)

        key(qtbot, Qt.Key.Key_M, CTRL)  # switch model: the recent one, picked by name
        await wait_until(lambda: window.model_pick.search.hasFocus(), 10, "the model list's search box")
        type_text(qtbot, "second-model")
        key(qtbot, Qt.Key.Key_Return)
        await asyncio.sleep(0.05)
        await wait_until(lambda: (service.request or {}).get("path") == str(second_model) and service.info is not None
                         and not window.model_panel.loading, 120, "the second model")

        for n, dock in enumerate(window.findChildren(QDockWidget)):  # every dock, Alt+1...
            key(qtbot, getattr(Qt.Key, f"Key_{n + 1}"), ALT)
            await wait_until(lambda d=dock: d.isAncestorOf(QApplication.focusWidget()), 10, dock.objectName())
            assert dock.widget().isVisible(), dock.objectName()
            assert dock.isAncestorOf(QApplication.focusWidget()), (dock.objectName(), QApplication.focusWidget())
        await service.close()

    run(loop, body())


def test_the_palette_finds_and_runs_every_command(qtbot, store):
    from app.window.command_palette import collect_actions
    from app.window.keymap import COMMANDS

    window = make_window(qtbot, store)
    window.new_chat()
    actions = collect_actions(window)
    names = {act.objectName() for _, act in actions}
    assert set(COMMANDS) <= names  # every command is in a menu, so the palette finds it
    window.open_palette()
    for path, act in actions:
        if not act.isEnabled():
            continue
        window.palette.search.setText(path.split(" › ")[-1])
        assert any(row.startswith(path) for row in window.palette.shown()), path
    window.palette.reject()

    palette_win = window.open_palette()
    palette_win.search.setText("tiles 4")
    qtbot.keyClick(palette_win.search, Qt.Key.Key_Return)
    assert len(visible_panes(window)) == 4  # the command ran (and filled four tiles)
    palette_win = window.open_palette()
    palette_win.search.setText("stop")  # commands named so before those only described so ("Quit ... stopped")
    assert [row.split("    ")[0] for row in palette_win.shown()][:2] == ["Chat › Stop", "Chat › Stop all"]
    palette_win.search.setText("zzz no such command")
    assert palette_win.shown() == [] and palette_win.empty.isVisibleTo(palette_win)


def test_the_shortcuts_window_lists_the_keys_that_work(qtbot, store):
    from app.window.command_palette import collect_actions, keys_text

    window = make_window(qtbot, store)
    help_window = window.open_shortcuts()
    rows = dict(help_window.rows())
    with_keys = [(path, act) for path, act in collect_actions(window) if act.shortcuts()]
    assert len(with_keys) >= 20
    for path, act in with_keys:
        assert rows[path] == keys_text(act)
    for wanted in ("File › New chat", "View › Command palette", "Chat › Send to all tiles", "Chat › Stop all",
                   "Chat › Regenerate", "Chat › Branch from the last message", "Chat › Switch model",
                   "View › Next chat pane", "View › Focus message box"):
        assert rows.get(wanted), wanted
    assert "Ctrl+K" in rows["View › Command palette"] and "Ctrl+Shift+P" in rows["View › Command palette"]
    help_window.close()
    key_f1 = window.findChild(type(with_keys[0][1]), "shortcuts")
    key_f1.trigger()
    assert window.shortcuts_help.isVisible()

"""Side docks collapse to icon rails when the window is short of width: one named, keyboard-reachable
button per panel reopens it; the user's choice (collapsed or open) is kept across restarts."""
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QDockWidget

from app.window.dock_rails import AUTO, OPEN, RAIL
from app.window.main_window import MainWindow
from tests.app.support import store  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(120)
RIGHT = {"DashboardDock", "Model", "LoRA", "Discover", "Server", "Batch"}


def settle():
    for _ in range(8):
        QApplication.processEvents()


def open_window(qtbot, store, state_path, width, height=700):  # noqa: F811
    win = MainWindow(store, state_path=state_path)
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    win.resize(width, height)
    settle()
    return win


def shown_docks(win) -> set[str]:
    return {d.objectName() for d in win.findChildren(QDockWidget) if not d.isHidden()}


def test_a_narrow_window_shows_rails_whose_buttons_reopen_a_panel(qtbot, store, tmp_path):  # noqa: F811
    win = open_window(qtbot, store, tmp_path / "state.ini", 1000)
    right, left = win.rails.sides["right"], win.rails.sides["left"]
    assert not right.bar.isVisible() and RIGHT <= shown_docks(win)  # wide: the panels, no rail

    win.resize(700, 600)
    settle()
    assert right.collapsed and right.bar.isVisible() and not (RIGHT & shown_docks(win))
    assert not left.collapsed and "Chats" in shown_docks(win)  # the chat list stays longer
    assert set(right.buttons) == RIGHT
    for name, button in right.buttons.items():
        title = win.dock(name).windowTitle()
        assert button.accessibleName() == f"Show the {title} panel" and button.toolTip() == button.accessibleName()
        assert not button.icon().isNull() and button.isVisible()
        assert button.focusPolicy() & Qt.FocusPolicy.TabFocus  # Tab reaches it
    assert right.bar.width() < 60  # a narrow rail, not a panel

    win.resize(500, 500)
    settle()
    assert left.collapsed and left.bar.isVisible() and set(left.buttons) == {"Chats"}
    room = win.width() - left.bar.width() - right.bar.width()
    assert win.centralWidget().width() >= room - 12  # the chat area has what the panels gave up

    win.resize(700, 600)
    settle()
    assert not left.collapsed and "Chats" in shown_docks(win)

    button = right.buttons["Model"]  # the keyboard: focus the button, press Space
    button.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.keyClick(button, Qt.Key.Key_Space)
    settle()
    assert not right.collapsed and not right.bar.isVisible() and RIGHT <= shown_docks(win)
    assert win.dock("Model").isVisible() and win.dock("Model").isAncestorOf(QApplication.focusWidget())
    assert right.choice == OPEN  # the user opened it: it stays open at this width


def test_the_users_choice_is_kept_across_restarts(qtbot, store, tmp_path):  # noqa: F811
    state = tmp_path / "state.ini"
    win = open_window(qtbot, store, state, 1000)
    right = win.rails.sides["right"]
    win.rails.collapse_actions["right"].trigger()  # View > Panels > Collapse the right panels to a rail
    settle()
    assert right.collapsed and right.choice == RAIL and not (RIGHT & shown_docks(win))
    win.close()
    settle()

    again = open_window(qtbot, store, state, 1000)  # wide, yet collapsed: the user chose so
    right = again.rails.sides["right"]
    assert right.collapsed and right.bar.isVisible() and not (RIGHT & shown_docks(again))
    assert again.rails.collapse_actions["right"].isChecked()
    again.rails.auto_action.trigger()  # back to the width rule: wide, so open with its panels
    settle()
    assert right.choice == AUTO and not right.collapsed and RIGHT <= shown_docks(again)
    assert again.dashboard.isVisible()  # the panel that was in front is in front again


def test_showing_a_panel_of_a_collapsed_side_opens_the_side(qtbot, store, tmp_path):  # noqa: F811
    win = open_window(qtbot, store, tmp_path / "state.ini", 700)
    right = win.rails.sides["right"]
    assert right.collapsed
    show_lora = next(a for a in win.findChildren(type(win.rails.auto_action)) if a.text() == "Show LoRA")
    show_lora.trigger()  # View > Panels > Show LoRA (Alt+N)
    settle()
    assert not right.collapsed and not right.bar.isVisible() and win.dock("LoRA").isVisible()

"""Every widget the keyboard can reach has a name a screen reader can say, in every dock and chat pane, in
both themes; Tab goes through the tiles pane by pane, each pane top to bottom."""
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QDockWidget, QWidget

from tests.app.support import make_window, store, visible_panes  # noqa: F401

pytestmark = pytest.mark.timeout(120)


def settle():
    for _ in range(5):
        QApplication.processEvents()


def unnamed(window) -> list[str]:
    """The focusable widgets of the window (popups, which are windows of their own, aside) without a name."""
    from app.window.accessibility import accessible_name

    out = []
    for w in window.findChildren(QWidget):
        if w.window() is window and w.focusPolicy() & Qt.FocusPolicy.TabFocus:
            if not (w.accessibleName().strip() or accessible_name(w)):
                chain, p = [], w
                while p is not None and p is not window:
                    chain.append(type(p).__name__)
                    p = p.parentWidget()
                out.append(" < ".join(chain[:4]))
    return out


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_focusable_widget_has_an_accessible_name(qtbot, store, theme):
    window = make_window(qtbot, store)
    window.theme.set_mode(theme)
    window.new_chat()
    window.view_actions[("tiles", 3)].trigger()
    window.chats.set_compare(True)
    pane = visible_panes(window)[0]
    pane.session.pin_text("notes.txt", "The harbour opens at six.")  # a pinned row with its Unpin button
    assert pane.pinned_list.unpin_buttons[0].accessibleName() == "Unpin notes.txt"  # not just "Unpin"
    window.chats.set_view("tabs")  # the tab bar and its panes
    settle()
    for dock in window.findChildren(QDockWidget):  # each dock shown in turn
        dock.raise_()
        settle()
        assert unnamed(window) == [], dock.objectName()
    window.view_actions[("tiles", 3)].trigger()
    window.chats.set_compare(True)
    settle()
    assert unnamed(window) == []
    for n, p in enumerate(visible_panes(window)):
        window.chat_list.rename(p.session.chat_id, f"Harbour {n}")
    names = sorted(p.prompt.accessibleName() for p in visible_panes(window))
    assert names == ["Message to Harbour 0", "Message to Harbour 1", "Message to Harbour 2"]  # they follow renames


def test_tab_goes_pane_by_pane(qtbot, store):
    window = make_window(qtbot, store)
    window.new_chat()
    window.view_actions[("tiles", 3)].trigger()
    settle()
    panes = window.chats.tiled()
    owner = {}
    for n, pane in enumerate(panes):
        for w in [pane, *pane.findChildren(QWidget)]:
            owner[w] = n
    start = panes[0].settings_btn
    start.setFocus()
    order, w = [], start
    for _ in range(200):  # Tab's path through the focus chain, as QWidget.focusNextChild walks it
        if w in owner and w.isVisible() and w.isEnabled() and w.focusPolicy() & Qt.FocusPolicy.TabFocus:
            order.append(w)
        w = w.nextInFocusChain()
        if w is start:
            break
    seen = [owner[w] for w in order]
    blocks = [n for i, n in enumerate(seen) if i == 0 or seen[i - 1] != n]
    assert blocks == [0, 1, 2], seen  # each pane whole, in tile order
    for pane in panes:
        inside = [w for w in order if owner[w] == panes.index(pane)]
        assert inside.index(pane.view) < inside.index(pane.prompt) < inside.index(pane.send_btn)
        assert inside.index(pane.prompt) + 1 == inside.index(pane.details_btn)  # the message box, then its row
    assert panes[0].prompt.tabChangesFocus()  # Tab leaves the message box instead of typing a tab

"""The chat's look on real widgets: message actions as icon buttons (named, doing what the links did, on a
real chat with the tiny model), the theme following the desktop's colour scheme, the empty chat's start page,
and WCAG AA for the design tokens' colour pairs in both themes."""
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette

from app.core.store import ChatSettings
from app.preferences.design_tokens import ROLE_COLOURS
from app.preferences.theme import dark_palette, light_palette
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401
from tests.app.test_contrast import AA, ratio
from tools.screenshots.look import hover

pytestmark = pytest.mark.timeout(240)


def _bar_over(pane, message_id):
    """Hover the mouse over a message's header: the bar shows that message's buttons."""
    hover(pane, message_id)
    bar = pane.actions_bar
    assert bar.message_id == message_id
    assert not bar.isHidden()
    return {v: b for v, b in bar.buttons.items() if not b.isHidden()}


def test_message_action_buttons_edit_copy_branch_regenerate(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat()
        await wait_until(pane.isVisible, what="the pane shown")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=8, seed=3))
        pane.send("first")
        await wait_until(lambda: not s.running and s.messages[-1].role == "assistant", what="reply")
        user, reply = s.messages
        assert "edit" not in pane.view.toPlainText().split("\n")[0]  # no row of links under the header

        buttons = _bar_over(pane, user.id)
        assert set(buttons) == {"edit", "copy", "branch"}
        for verb, b in buttons.items():
            assert b.accessibleName() and b.toolTip() == b.accessibleName() and not b.icon().isNull()
        buttons = _bar_over(pane, reply.id)
        assert set(buttons) == {"copy", "branch", "regen"} | ({"continue"} if s.can_continue() else set())
        assert buttons["regen"].accessibleName() == "Regenerate this reply"

        buttons["copy"].click()
        assert QGuiApplication.clipboard().text() == reply.content
        before = reply.id
        buttons["regen"].click()
        await wait_until(lambda: not s.running and s.messages[-1].id != before
                         and s.messages[-1].stats.state == "done", what="regenerated reply")
        branched = []
        pane.branched.connect(branched.append)
        _bar_over(pane, s.messages[0].id)["branch"].click()
        assert branched and branched[0] != s.chat_id
        _bar_over(pane, s.messages[0].id)["edit"].click()
        assert pane.editing == s.messages[0].id and pane.prompt.toPlainText() == "first"
        await window.service.close()

    run(loop, body())


def test_keyboard_reaches_the_action_buttons(qtbot, loop, store):
    async def body():
        window = make_window(qtbot, store)
        pane = window.new_chat()
        await wait_until(pane.isVisible, what="the pane shown")
        msg = window.store.add_message(pane.session.chat_id, "user", "hello")
        pane.session.messages.append(msg)
        pane.rebuild()
        pane.view.setFocus()
        await wait_until(lambda: pane.view.hasFocus(), what="focus")
        assert pane.actions_bar.isVisible() and pane.actions_bar.message_id == msg.id
        pane.view.focusNextChild()  # Tab from the conversation
        assert QGuiApplication.focusObject() is pane.actions_bar.buttons["edit"]

    run(loop, body())


def test_theme_follows_the_desktop_scheme_and_restyles_the_bar(qtbot, loop, store):
    async def body():
        window = make_window(qtbot, store)
        pane = window.new_chat()
        await wait_until(pane.isVisible, what="the pane shown")
        hints = QGuiApplication.styleHints()
        window.theme.set_mode("system")
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
        assert window.theme.dark and QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 100
        assert ROLE_COLOURS["dark"].chip_border and "#4e5058" in pane.actions_bar.styleSheet()
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
        assert not window.theme.dark and "#c8ccd2" in pane.actions_bar.styleSheet()

    run(loop, body())


def test_empty_chat_suggests_a_start_and_an_example_fills_the_box(qtbot, loop, store):
    async def body():
        window = make_window(qtbot, store)
        pane = window.new_chat()
        await wait_until(pane.isVisible, what="the pane shown")
        empty = pane.empty_state
        assert empty.isVisible()
        assert empty.model_btn.text() == "Choose a model…"  # no model loaded
        assert {"Precise", "Balanced", "Creative"} <= set(empty.preset_buttons)
        assert empty.preset_buttons["Balanced"].isChecked()
        empty.preset_buttons["Creative"].click()
        assert pane.session.settings.temperature == 1.1 and empty.preset_buttons["Creative"].isChecked()
        example = empty.example_buttons[0]
        example.click()
        assert pane.prompt.toPlainText() == example.text() and pane.session.messages == []
        pane.submit()
        await wait_until(lambda: not pane.session.running, what="reply to end")
        assert not empty.isVisible()

    run(loop, body())


THEMES = {"light": light_palette, "dark": dark_palette}


@pytest.mark.parametrize("theme", list(THEMES))
def test_token_colour_pairs_reach_aa(qapp, theme):
    c, p = ROLE_COLOURS[theme], THEMES[theme]()
    text, base = p.color(QPalette.ColorRole.Text), p.color(QPalette.ColorRole.Base)
    pairs = {
        "text on user bubble": (text, QColor(*c.user_bubble)),
        "link on user bubble": (p.color(QPalette.ColorRole.Link), QColor(*c.user_bubble)),
        "text on assistant": (text, QColor(*c.assistant_bubble)),
        "role label on base": (QColor(*c.role_label), base),
        "role label on user bubble": (QColor(*c.role_label), QColor(*c.user_bubble)),
        "chip text": (QColor(*c.chip_text), QColor(*c.chip)),
        "chip text checked": (QColor(*c.chip_text), QColor(*c.chip_checked)),
        "title on base": (QColor(*c.role_label), base),
    }
    assert c.assistant_bubble == base.getRgb()[:3]  # the assistant's turns sit on the transcript itself
    assert not {k: round(ratio(a, b), 2) for k, (a, b) in pairs.items() if ratio(a, b) < AA}


def test_a_short_empty_chat_drops_suggestions_rather_than_squash_them(qtbot, qapp):
    from PySide6.QtWidgets import QPushButton, QWidget

    from app.chat.empty_state import EmptyState

    host = QWidget()
    qtbot.addWidget(host)
    empty = EmptyState(host)
    empty.set_model(None)
    empty.set_presets(["Precise", "Balanced"], "Balanced")
    host.resize(460, 200)
    host.show()
    qtbot.waitExposed(host)
    shown = [b for b in empty.findChildren(QPushButton) if b.isVisible()]
    assert empty.model_btn in shown and len(shown) < 2 + 1 + len(empty.example_buttons)  # some were dropped
    assert all(b.height() >= b.sizeHint().height() for b in shown)  # and those shown are whole
    host.resize(460, 600)
    assert all(b.isVisible() for b in empty.example_buttons)  # room again: every example is back

"""Theme (system / light / dark) and font size: applied live to the open window, remembered in the settings file."""
from __future__ import annotations

import re

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from app.preferences.preferences import Preferences
from tests.app.support import loop, make_window, run, store  # noqa: F401 - fixtures

Role = QPalette.ColorRole


def settle() -> None:
    """Deliver the palette/font change events Qt posts to every widget (the app's event loop does this)."""
    QApplication.processEvents()


@pytest.fixture(autouse=True)
def _system_look_after(qapp):
    yield
    from app.preferences.theme import restore_system_look

    qapp.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Light)
    restore_system_look()
    settle()


def contrast(a: QColor, b: QColor) -> float:
    """WCAG contrast ratio of two colours (1 = same, 21 = black on white)."""
    def lum(c: QColor) -> float:
        def ch(v: float) -> float:
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
        return 0.2126 * ch(c.redF()) + 0.7152 * ch(c.greenF()) + 0.0722 * ch(c.blueF())
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_dark_override_repaints_the_open_window_and_is_remembered(qtbot, loop, store):  # noqa: F811
    async def body():
        window = make_window(qtbot, store)
        pane = window.new_chat()
        light_base = pane.view.palette().color(Role.Base)
        window.theme.set_mode("dark")
        settle()
        base, text = pane.view.palette().color(Role.Base), pane.view.palette().color(Role.Text)
        assert base.lightness() < 80 < text.lightness() and contrast(base, text) >= 7
        assert window.palette().color(Role.Window).lightness() < 80
        assert light_base.lightness() > 128  # it really changed
        link = pane.view.palette().color(Role.Link)
        assert contrast(link, base) >= 4.5  # the transcript's action links stay readable
        assert Preferences().theme == "dark"
        window.theme.set_mode("light")
        settle()
        assert pane.view.palette().color(Role.Base).lightness() > 200

    run(loop, body())


def test_system_mode_follows_the_desktop_and_overrides_do_not(qtbot, loop, store):  # noqa: F811
    async def body():
        window = make_window(qtbot, store)
        hints = window.theme.app.styleHints()
        assert window.theme.mode == "system" and not window.theme.dark
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)  # what Qt sends when the user flips the desktop
        settle()
        assert window.theme.dark and window.palette().color(Role.Window).lightness() < 80
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
        settle()
        assert not window.theme.dark and window.palette().color(Role.Window).lightness() > 128
        window.theme.set_mode("light")  # a manual choice wins over the desktop
        settle()
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
        settle()
        assert not window.theme.dark and window.palette().color(Role.Window).lightness() > 128
        window.theme.set_mode("system")
        settle()
        assert window.theme.dark  # back to following: the desktop is dark now

    run(loop, body())


def test_font_size_applies_live_to_chats_and_persists(qtbot, loop, store):  # noqa: F811
    async def body():
        window = make_window(qtbot, store)
        pane = window.new_chat()
        system = pane.view.font().pointSize()
        window.theme.set_font_size(system + 5)
        settle()
        assert pane.view.font().pointSize() == system + 5
        assert pane.view.document().defaultFont().pointSize() == system + 5  # the transcript text itself
        assert pane.prompt.font().pointSize() == system + 5
        assert Preferences().font_size == system + 5
        window.theme.set_font_size(0)
        settle()
        assert pane.view.font().pointSize() == system
        with pytest.raises(ValueError, match="font size"):
            window.theme.set_font_size(200)

    run(loop, body())


def test_preferences_dialog_previews_live_cancel_reverts_ok_keeps(qtbot, loop, store, tmp_path,  # noqa: F811
                                                                     monkeypatch):
    path = tmp_path / "p.ini"
    monkeypatch.setenv("PAGEDECK_SETTINGS", str(path))

    async def body():
        window = make_window(qtbot, store)
        menu_items = [a.text() for a in window.menuBar().actions()[0].menu().actions()]
        assert "&Preferences…" in menu_items
        dlg = window.open_preferences()
        qtbot.addWidget(dlg)
        dlg.theme_box.setCurrentIndex(dlg.theme_box.findData("dark"))
        settle()
        assert window.theme.dark  # live, before OK
        dlg.font_size.setValue(15)
        settle()
        assert window.font().pointSize() == 15
        dlg.reject()
        settle()
        assert not window.theme.dark and Preferences().theme == "system" and Preferences().font_size == 0
        dlg = window.open_preferences()
        qtbot.addWidget(dlg)
        dlg.theme_box.setCurrentIndex(dlg.theme_box.findData("dark"))
        settle()
        dlg.system_prompt.setPlainText("Answer briefly.")
        dlg.preset.setCurrentIndex(dlg.preset.findData("Precise"))
        dlg.accept()
        settle()
        text = path.read_text()
        assert "theme=dark" in text and "Answer briefly." in text and "Precise" in text
        assert window.new_chat().session.settings.system_prompt == "Answer briefly."

    run(loop, body())


def test_page_map_and_dashboard_stay_readable_in_dark(qtbot, loop, store):  # noqa: F811
    from app.panels.pagemap import BACKGROUND, FREE_COLOUR, _legend_html

    async def body():
        window = make_window(qtbot, store)
        window.theme.set_mode("dark")
        settle()
        window_bg = window.palette().color(Role.Window)
        charts = window.dashboard.charts
        chart_bg = charts.backgroundBrush().color()
        for plot in window.dashboard.plots.values():
            axis = plot.getAxis("left")
            assert contrast(axis.textPen().color(), chart_bg) >= 4.5
        # The page map's legend draws each swatch on the map's own background: a free page's dark grey
        # would vanish on the dark window otherwise.
        assert contrast(QColor(*FREE_COLOUR[:3]), window_bg) < 1.5
        swatches = re.findall(r"background-color: rgb\((\d+),(\d+),(\d+)\); color: rgb\((\d+),(\d+),(\d+)\)",
                              _legend_html())
        assert len(swatches) >= 6
        for *bg, r, g, b in swatches:
            assert tuple(map(int, bg)) == BACKGROUND[:3]
            assert contrast(QColor(int(r), int(g), int(b)), QColor(*BACKGROUND[:3])) > contrast(
                QColor(*FREE_COLOUR[:3]), window_bg)

    run(loop, body())

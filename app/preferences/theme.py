"""Light/dark look and font size for the whole app, following the system unless the user overrides it.

Qt reports the desktop's colour scheme (QStyleHints.colorScheme, and colorSchemeChanged when the user
flips it); the app applies a palette of its own for the scheme it wants, because the platform palette
only ever matches the system (a "dark" override on a light desktop would otherwise keep light colours).
Widgets that colour things themselves (code highlighting) ask `is_dark()` of the app palette. Both
palettes keep text at WCAG AA (4.5:1) on its background: Fusion's light highlight and visited-link colours
fall short, so the light palette takes darker shades of the same hues.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QFont, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

from app.preferences.contrast import readable
from app.preferences.preferences import Preferences

_Role, _Group = QPalette.ColorRole, QPalette.ColorGroup
_DARK = {
    _Role.Window: (45, 45, 48), _Role.WindowText: (225, 225, 225), _Role.Base: (30, 30, 32),
    _Role.AlternateBase: (40, 40, 44), _Role.ToolTipBase: (50, 50, 54), _Role.ToolTipText: (225, 225, 225),
    _Role.PlaceholderText: (150, 150, 150), _Role.Text: (225, 225, 225), _Role.Button: (53, 53, 57),
    _Role.ButtonText: (225, 225, 225), _Role.BrightText: (255, 90, 90), _Role.Light: (75, 75, 80),
    _Role.Midlight: (62, 62, 66), _Role.Mid: (40, 40, 43), _Role.Dark: (25, 25, 27), _Role.Shadow: (10, 10, 10),
    _Role.Highlight: (39, 120, 201), _Role.HighlightedText: (255, 255, 255), _Role.Link: (110, 170, 255),
    _Role.LinkVisited: (180, 140, 255),
}
_DARK_DISABLED = {_Role.WindowText: (125, 125, 125), _Role.Text: (125, 125, 125), _Role.ButtonText: (125, 125, 125),
                  _Role.Highlight: (80, 80, 85), _Role.HighlightedText: (160, 160, 160)}
_SYSTEM: dict[int, tuple[QPalette, QFont]] = {}  # per QApplication: its palette and font before any theme


def is_dark(palette: QPalette | None = None) -> bool:
    """Whether `palette` (default: the app's) draws light text on a dark window."""
    p = palette if palette is not None else QGuiApplication.palette()
    return p.color(_Role.Window).lightness() < p.color(_Role.WindowText).lightness()


def dark_palette() -> QPalette:
    p = QPalette()
    for role, rgb in _DARK.items():
        p.setColor(role, QColor(*rgb))
    for role, rgb in _DARK_DISABLED.items():
        p.setColor(_Group.Disabled, role, QColor(*rgb))
    return p


_LIGHT = {_Role.Highlight: (43, 125, 176), _Role.LinkVisited: (209, 0, 209)}  # Fusion's, darkened to reach AA


def light_palette() -> QPalette:
    """Fusion's standard palette (light whatever the desktop uses) with AA-contrast highlight and visited links."""
    style = QStyleFactory.create("Fusion")
    try:
        p = QPalette(style.standardPalette())
    finally:
        style.deleteLater()
    for role, rgb in _LIGHT.items():
        p.setColor(_Group.Active, role, QColor(*rgb))
        p.setColor(_Group.Inactive, role, QColor(*rgb))
    return p


def quiet_text(palette: QPalette | None = None) -> QColor:
    """Grey for secondary text (a reply's stats, a code block's language): the mid grey, shaded just enough
    to read at AA on both the palette's Base (documents) and Window (panels)."""
    p = palette if palette is not None else QGuiApplication.palette()
    rgb = (128, 128, 128)
    for role in (_Role.Base, _Role.Window, _Role.Base):  # twice: a shade for one may need re-checking on the other
        rgb = readable(rgb, p.color(role).getRgb()[:3])
    return QColor(*rgb)


class Theme(QObject):
    """Applies Preferences' theme and font size to the QApplication, now and whenever either changes."""

    changed = Signal(bool)  # dark?

    def __init__(self, prefs: Preferences, parent: QObject | None = None):
        super().__init__(parent)
        self.prefs = prefs
        self.app = QApplication.instance()
        if id(self.app) not in _SYSTEM:
            _SYSTEM[id(self.app)] = (QPalette(self.app.palette()), QFont(self.app.font()))
        self._system_palette, self._system_font = _SYSTEM[id(self.app)]
        hints = self.app.styleHints()
        self.system_scheme = hints.colorScheme()
        hints.colorSchemeChanged.connect(self._system_scheme_changed)
        self.dark = False

    @property
    def mode(self) -> str:
        return self.prefs.theme

    def set_mode(self, mode: str) -> None:
        self.prefs.theme = mode
        self.apply()

    def set_font_size(self, points: int) -> None:
        self.prefs.font_size = points
        self.apply()

    def wants_dark(self) -> bool:
        mode = self.prefs.theme
        if mode == "system":
            if self.system_scheme == Qt.ColorScheme.Unknown:
                return is_dark(self._system_palette)
            return self.system_scheme == Qt.ColorScheme.Dark
        return mode == "dark"

    def apply(self) -> None:
        dark = self.wants_dark()
        if is_dark(self._system_palette) == dark:
            palette = self._system_palette  # the desktop's own palette already has the wanted scheme
        else:
            palette = dark_palette() if dark else light_palette()
        font = QFont(self._system_font)
        if self.prefs.font_size:
            font.setPointSize(self.prefs.font_size)
        # Each set re-polishes every widget: only when something changed (a new window with the look
        # already in place costs nothing).
        if self.app.palette() != palette:
            self.app.setPalette(palette)
        if self.app.font() != font:
            self.app.setFont(font)
        self.dark = dark
        self.changed.emit(dark)


    def _system_scheme_changed(self, scheme: Qt.ColorScheme) -> None:
        self.system_scheme = scheme
        if self.prefs.theme == "system":
            self.apply()


def restore_system_look() -> None:
    """Back to the palette and font the app had before any Theme applied (tests end with this)."""
    app = QApplication.instance()
    if app is not None and id(app) in _SYSTEM:
        palette, font = _SYSTEM[id(app)]
        app.setPalette(palette)
        app.setFont(font)

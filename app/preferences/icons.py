"""The app's one icon set: the desktop theme's icons where it has every one of them, else the bundled set.

The bundled icons (resources/icons/actions/*.svg, line icons on a 16 px grid) are drawn in `currentColor`
and tinted here with the palette's text colour, so they read in the light and the dark theme alike. Mixing
sets would look patched together, so the desktop's theme (QIcon.fromTheme, e.g. Breeze or Adwaita) is used
only when it has all of them.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer

from app.preferences.design_tokens import ICON

BUNDLED = Path(__file__).resolve().parents[2] / "resources" / "icons" / "actions"
# Each icon of the set and its freedesktop icon-naming-spec name.
THEME_NAMES = {
    "edit": "document-edit", "copy": "edit-copy", "branch": "vcs-branch", "regenerate": "view-refresh",
    "continue": "media-playback-start", "model": "cpu", "presets": "configure",
    # the side panels, on their icon rails (app.window.dock_rails)
    "chats": "internet-group-chat", "dashboard": "utilities-system-monitor", "lora": "preferences-plugin",
    "discover": "system-search", "server": "network-server", "batch": "view-list-details",
}


def names() -> list[str]:
    return list(THEME_NAMES)


def desktop_has_all() -> bool:
    return all(QIcon.hasThemeIcon(n) for n in THEME_NAMES.values())


def svg(name: str) -> str:
    """The bundled SVG of icon `name` (ValueError naming the known ones if there is none)."""
    if name not in THEME_NAMES:
        raise ValueError(f"no icon named {name!r}; the set has {', '.join(THEME_NAMES)}")
    return (BUNDLED / f"{name}.svg").read_text()


# Bundled icons already drawn, by (name, normal colour, disabled colour). Each new QIcon gets pixmaps of its
# own in Qt's QPixmapCache (kept until its 10 MB budget evicts them), so drawing a pane's buttons' icons afresh
# for every new chat pane filled that cache with copies of the same few icons on the main thread's heap.
_DRAWN: dict[tuple[str, str, str], QIcon] = {}


def icon(name: str, palette: QPalette | None = None) -> QIcon:
    """Icon `name`: the desktop theme's if it has the whole set, else the bundled SVG in the palette's text colour
    (normal and disabled states, at 1x and 2x); the same icon object for the same name and colours."""
    source = svg(name)
    if desktop_has_all():
        return QIcon.fromTheme(THEME_NAMES[name])
    p = palette if palette is not None else QGuiApplication.palette()
    colours = tuple(p.color(group, QPalette.ColorRole.ButtonText).name()
                    for group in (QPalette.ColorGroup.Active, QPalette.ColorGroup.Disabled))
    key = (name, *colours)
    if key not in _DRAWN:
        _DRAWN[key] = _draw(source, colours)
    return _DRAWN[key]


def _draw(source: str, colours: tuple[str, ...]) -> QIcon:
    out = QIcon()
    for mode, colour in zip((QIcon.Mode.Normal, QIcon.Mode.Disabled), colours):
        renderer = QSvgRenderer(QByteArray(source.replace("currentColor", colour).encode()))
        for scale in (1, 2):
            pix = QPixmap(ICON * scale, ICON * scale)
            pix.fill(Qt.GlobalColor.transparent)
            painter = QPainter(pix)
            renderer.render(painter, QRectF(0, 0, ICON * scale, ICON * scale))
            painter.end()
            pix.setDevicePixelRatio(scale)
            out.addPixmap(pix, mode)
    return out

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


def icon(name: str, palette: QPalette | None = None) -> QIcon:
    """Icon `name`: the desktop theme's if it has the whole set, else the bundled SVG in the palette's text colour
    (normal and disabled states, at 1x and 2x)."""
    source = svg(name)
    if desktop_has_all():
        return QIcon.fromTheme(THEME_NAMES[name])
    p = palette if palette is not None else QGuiApplication.palette()
    out = QIcon()
    for mode, group in ((QIcon.Mode.Normal, QPalette.ColorGroup.Active),
                        (QIcon.Mode.Disabled, QPalette.ColorGroup.Disabled)):
        colour = p.color(group, QPalette.ColorRole.ButtonText).name()
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

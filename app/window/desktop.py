"""pagedeck as a desktop application: its .desktop entry and icon under the user's XDG data dir, and the
identity the running app gives Qt so window managers show that icon.

The desktop file's name is the app id: on Wayland the compositor finds the window's icon and name
through `QGuiApplication.desktopFileName()` -> pagedeck.desktop -> Icon=pagedeck; on X11 the window
carries the icon itself (_NET_WM_ICON from `setWindowIcon`) and StartupWMClass matches Qt's WM_CLASS
(the application name), so docks group the window under the launcher.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import platformdirs

from engine.contract.paths import resources_folder

if TYPE_CHECKING:
    from PySide6.QtGui import QGuiApplication, QIcon

APP_ID = "pagedeck"  # desktop file name, icon name, Qt application name and WM_CLASS
ICONS = resources_folder() / "icons"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256)  # rendered from pagedeck.svg by packaging/render_icons.py

# Exec's quoting rules (Desktop Entry spec, "The Exec key"): these make an argument need double quotes.
_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def data_home() -> Path:
    """$XDG_DATA_HOME, else ~/.local/share: where per-user applications/ and icons/ live (freedesktop only)."""
    if sys.platform in ("darwin", "win32"):
        raise RuntimeError("desktop entries are a freedesktop (Linux/BSD) feature; nothing to install here")
    return platformdirs.user_data_path()


def launcher() -> list[str]:
    """The command that starts this installation: its own `pagedeck` script (a pipx or venv install puts it
    beside the interpreter; the path is not resolved, so a venv's python stays the venv's), else
    `python -m app` with this interpreter."""
    script = Path(sys.executable).parent / APP_ID
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script.absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "app"]


def exec_value(argv: Sequence[str]) -> str:
    """`argv` as a desktop file Exec value: arguments quoted per the spec, then escaped as a string value."""
    quoted = []
    for arg in argv:
        if any(c in _RESERVED for c in arg):
            arg = '"' + "".join("\\" + c if c in '"`$\\' else c for c in arg) + '"'
        quoted.append(arg.replace("%", "%%"))
    return " ".join(quoted).replace("\\", "\\\\")


def desktop_entry(argv: Sequence[str]) -> str:
    """The text of pagedeck.desktop for a launcher command."""
    return "\n".join([
        "[Desktop Entry]",
        "Type=Application",
        "Version=1.4",
        "Name=pagedeck",
        "GenericName=LLM Chat",
        "Comment=Chat with local language models, several conversations at once",
        f"Exec={exec_value(argv)}",
        f"Icon={APP_ID}",
        "Terminal=false",
        "Categories=Utility;",
        "Keywords=LLM;AI;chat;language model;",
        f"StartupWMClass={APP_ID}",
        "StartupNotify=true",
        "",
    ])


def install_desktop(home: Path | None = None, argv: Sequence[str] | None = None) -> list[Path]:
    """Write applications/pagedeck.desktop and the icons (hicolor theme: the SVG and each PNG size) under
    `home` (default: data_home()); returns the files written. Re-running replaces them."""
    home = data_home() if home is None else Path(home)
    written = []
    targets = [(ICONS / f"{APP_ID}.svg", home / "icons/hicolor/scalable/apps" / f"{APP_ID}.svg")]
    targets += [(ICONS / f"{APP_ID}-{n}.png", home / f"icons/hicolor/{n}x{n}/apps" / f"{APP_ID}.png") for n in PNG_SIZES]
    for src, dst in targets:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        written.append(dst)
    entry = home / "applications" / f"{APP_ID}.desktop"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text(desktop_entry(launcher() if argv is None else argv), encoding="utf-8")
    written.append(entry)
    return written


def uninstall_desktop(home: Path | None = None) -> list[Path]:
    """Remove what install_desktop wrote; returns the files removed."""
    home = data_home() if home is None else Path(home)
    paths = [home / "applications" / f"{APP_ID}.desktop", home / "icons/hicolor/scalable/apps" / f"{APP_ID}.svg"]
    paths += [home / f"icons/hicolor/{n}x{n}/apps" / f"{APP_ID}.png" for n in PNG_SIZES]
    removed = [p for p in paths if p.is_file()]
    for p in removed:
        p.unlink()
    return removed


def app_icon() -> QIcon:
    """The window icon, every shipped PNG size (a window manager picks the size it draws)."""
    from PySide6.QtGui import QIcon

    icon = QIcon()
    for n in PNG_SIZES:
        icon.addFile(str(ICONS / f"{APP_ID}-{n}.png"))
    return icon


def apply_identity(app: QGuiApplication) -> None:
    """Give the running app its desktop identity: name, desktop file (Wayland's app id) and window icon."""
    app.setApplicationName(APP_ID)
    app.setDesktopFileName(APP_ID)
    app.setWindowIcon(app_icon())

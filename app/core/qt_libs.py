"""Which system libraries Qt's platform plugin needs but can't find, and the apt/dnf command that installs them.

PySide6's wheels bring Qt itself but not the X11/xcb, xkbcommon, GL and Wayland libraries of the system.
When one is missing, Qt aborts the process with "Could not load the Qt platform plugin" and no package
name. This module asks the dynamic linker the same question before Qt does: `ldd` on the plugin Qt
will load (which resolves the whole dependency tree with the plugin's own RPATH), so what it reports
missing is exactly what would make the load fail. It never imports Qt, so it runs where Qt can't.

    python -m app.core.qt_libs                 # the plugin(s) this session would use; exit 1 and the commands if missing
    python -m app.core.qt_libs --platform xcb  # a given platform plugin
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

# soname -> (Debian/Ubuntu package, Fedora package): what Qt 6's xcb, wayland and offscreen plugins link
# beyond glibc. Debian names checked with `dpkg -S` (tests/app/test_qt_libs.py does this on every run).
PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-xinerama.so.0": ("libxcb-xinerama0", "libxcb"),
    "libxcb-xinput.so.0": ("libxcb-xinput0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-glx.so.0": ("libxcb-glx0", "libxcb"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libXau.so.6": ("libxau6", "libXau"),
    "libXdmcp.so.6": ("libxdmcp6", "libXdmcp"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libGLX.so.0": ("libglx0", "libglvnd-glx"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libGLdispatch.so.0": ("libglvnd0", "libglvnd"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libgthread-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client"),
    "libwayland-cursor.so.0": ("libwayland-cursor0", "libwayland-cursor"),
    "libwayland-egl.so.1": ("libwayland-egl1", "libwayland-egl"),
}


def platforms_to_try(environ: dict[str, str] | None = None) -> list[str]:
    """The platform plugins Qt will try, in order, as Qt 6 chooses them: QT_QPA_PLATFORM's list if set,
    else Wayland then xcb in a Wayland session, else xcb."""
    env = os.environ if environ is None else environ
    chosen = [p.split(":")[0].strip() for p in env.get("QT_QPA_PLATFORM", "").split(";") if p.strip()]
    if chosen:
        return chosen
    return ["wayland", "xcb"] if env.get("XDG_SESSION_TYPE") == "wayland" else ["xcb"]


def plugin_path(name: str, environ: dict[str, str] | None = None) -> Path | None:
    """The platform plugin file Qt would load for `name` (xcb -> libqxcb.so), searched where Qt searches:
    $QT_QPA_PLATFORM_PLUGIN_PATH, each $QT_PLUGIN_PATH/platforms, then PySide6's own plugins (found without
    importing Qt); None if there is no such plugin."""
    env = os.environ if environ is None else environ
    dirs = [Path(env["QT_QPA_PLATFORM_PLUGIN_PATH"])] if env.get("QT_QPA_PLATFORM_PLUGIN_PATH") else []
    dirs += [Path(d) / "platforms" for d in env.get("QT_PLUGIN_PATH", "").split(os.pathsep) if d]
    spec = importlib.util.find_spec("PySide6")
    if spec is not None and spec.submodule_search_locations:
        dirs += [Path(root) / "Qt" / "plugins" / "platforms" for root in spec.submodule_search_locations]
    return next((d / f"libq{name}.so" for d in dirs if (d / f"libq{name}.so").is_file()), None)


def missing_libraries(binary: str | Path) -> list[str] | None:
    """Sonames the dynamic linker can't find for `binary` and its whole dependency tree, in ldd's order;
    None where that can't be asked (no ldd: not a glibc Linux)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    out = subprocess.run([ldd, str(binary)], capture_output=True, text=True, check=False).stdout
    missing: list[str] = []
    for line in out.splitlines():
        name, sep, where = line.strip().partition("=>")
        if sep and where.strip() == "not found" and name.strip() not in missing:
            missing.append(name.strip())
    return missing


def install_commands(missing: Sequence[str]) -> list[str]:
    """The exact commands that install the packages holding `missing`: apt (Debian/Ubuntu), then dnf
    (Fedora). An unknown soname goes to dnf as an RPM soname capability (exact for any library) and
    gets an apt-file search for apt, which has no such capability."""
    apt: list[str] = []
    dnf: list[str] = []
    unknown: list[str] = []
    bits = "(64bit)" if platform.architecture()[0] == "64bit" else ""
    for soname in missing:
        if soname in PACKAGES:
            deb, rpm = PACKAGES[soname]
        else:
            unknown.append(soname)
            deb, rpm = None, f"'{soname}(){bits}'"
        if deb is not None and deb not in apt:
            apt.append(deb)
        if rpm not in dnf:
            dnf.append(rpm)
    commands = []
    if apt:
        commands.append("sudo apt install " + " ".join(apt))
    commands += [f"apt-file search {soname}   # then apt install the package it names" for soname in unknown]
    commands.append("sudo dnf install " + " ".join(dnf))
    return commands


def check(environ: dict[str, str] | None = None, platforms: Sequence[str] | None = None) -> str | None:
    """None if Qt can load one of the platform plugins it will try (or this can't be checked); else a
    message naming the missing libraries and the apt/dnf commands that install them."""
    names = list(platforms) if platforms else platforms_to_try(environ)
    problems: dict[str, list[str]] = {}
    for name in names:
        path = plugin_path(name, environ)
        if path is None:
            continue  # not a plugin PySide6 ships (e.g. "windows"): Qt's own error is clearer
        missing = missing_libraries(path)
        if not missing:  # [] loads; None can't be checked: let Qt try
            return None
        problems[f"Qt's {name} platform plugin"] = missing
    if not problems:
        return None
    return report(problems)


def report(problems: dict[str, list[str]]) -> str:
    """The message for {what failed to load: its missing sonames}."""
    missing = list(dict.fromkeys(s for libs in problems.values() for s in libs))
    lines = [f"{what} can't load: missing {', '.join(libs)}" for what, libs in problems.items()]
    lines += ["Install the system libraries Qt needs with one of:"]
    lines += [f"    {cmd}" for cmd in install_commands(missing)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.core.qt_libs", description=__doc__.split("\n\n")[0])
    p.add_argument("--platform", action="append",
                   help="platform plugin to check (xcb, wayland, offscreen...); default: what Qt would try here")
    p.add_argument("--binary", type=Path, help="check this shared library instead of a Qt plugin")
    p.add_argument("--apt-packages", action="store_true",
                   help="print only the Debian packages that hold the missing libraries (for `make setup`)")
    args = p.parse_args(argv)
    if args.apt_packages:
        plugins = [plugin_path(name) for name in (args.platform or platforms_to_try())]
        missing = [lib for path in plugins if path is not None for lib in (missing_libraries(path) or [])]
        print(" ".join(dict.fromkeys(PACKAGES[lib][0] for lib in missing if PACKAGES.get(lib, (None,))[0])))
        return 0
    if args.binary is not None:
        missing = missing_libraries(args.binary)
        message = report({str(args.binary): missing}) if missing else None
    else:
        message = check(platforms=args.platform)
    if message:
        print(message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

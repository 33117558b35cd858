"""app.core.qt_libs against the real dynamic linker: the installed PySide6 plugins, and libraries built here whose
dependency is then deleted. Qt aborts without naming a package when its platform plugin can't load; these
prove the check says exactly what's missing and which apt/dnf packages hold it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.core import qt_libs

ROOT = Path(__file__).resolve().parents[2]
needs_ldd = pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd (glibc Linux)")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc) to build test libraries")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QT_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _build_library_with_deleted_dependency(tmp: Path, plugin_name: str = "libuser.so") -> Path:
    """A shared library linked against libpagedeck-gone.so.1 (found via its RPATH), then that dependency
    deleted: what a plugin looks like on a machine without one of its system libraries."""
    (tmp / "gone.c").write_text("int gone(void) { return 1; }\n")
    (tmp / "user.c").write_text("int gone(void);\nint user(void) { return gone(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libpagedeck-gone.so.1", "-o",
                    str(tmp / "libpagedeck-gone.so.1"), str(tmp / "gone.c")], check=True)
    (tmp / "libpagedeck-gone.so").symlink_to("libpagedeck-gone.so.1")
    user = tmp / plugin_name
    user.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(user), str(tmp / "user.c"), f"-L{tmp}", "-lpagedeck-gone",
                    f"-Wl,-rpath,{tmp}"], check=True)
    assert qt_libs.missing_libraries(user) == []  # present: nothing missing
    (tmp / "libpagedeck-gone.so.1").unlink()
    return user


@needs_ldd
@pytest.mark.parametrize("platform", ["xcb", "wayland", "offscreen"])
def test_missing_libraries_of_real_plugins_agree_with_dlopen(platform):
    """Oracle: the plugin loads with dlopen exactly when nothing is reported missing, and when it doesn't,
    the library dlopen names is among the reported ones (on this machine xcb and wayland miss some)."""
    plugin = qt_libs.plugin_path(platform, {})
    if plugin is None:
        pytest.skip(f"this PySide6 has no {platform} plugin")
    missing = qt_libs.missing_libraries(plugin)
    probe = subprocess.run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", str(plugin)],
                           capture_output=True, text=True, env=_env())
    if missing:
        assert probe.returncode != 0
        assert any(f"{soname}: cannot open shared object file" in probe.stderr for soname in missing), probe.stderr
        message = qt_libs.check(platforms=[platform], environ={})
        assert f"Qt's {platform} platform plugin can't load: missing {', '.join(missing)}" in message
        assert "sudo apt install " in message and "sudo dnf install " in message
    else:
        assert probe.returncode == 0, probe.stderr
        assert qt_libs.check(platforms=[platform], environ={}) is None


@needs_ldd
@needs_cc
def test_deleted_dependency_is_reported_with_commands(tmp_path):
    user = _build_library_with_deleted_dependency(tmp_path)
    assert qt_libs.missing_libraries(user) == ["libpagedeck-gone.so.1"]
    out = subprocess.run([sys.executable, "-m", "app.core.qt_libs", "--binary", str(user)], capture_output=True,
                         text=True, env=_env())
    assert out.returncode == 1
    assert f"{user} can't load: missing libpagedeck-gone.so.1" in out.stderr
    # No package is known for it: apt-file finds one, dnf installs by the RPM soname capability.
    assert "apt-file search libpagedeck-gone.so.1" in out.stderr
    assert "sudo dnf install 'libpagedeck-gone.so.1()(64bit)'" in out.stderr


@needs_ldd
@needs_cc
def test_app_refuses_to_start_on_an_unloadable_platform_plugin_and_names_the_fix(tmp_path):
    """`pagedeck` (what `make run` runs) stops before Qt would abort, printing the commands; Qt is never
    started (no QApplication: the plugin here is not even a Qt plugin)."""
    _build_library_with_deleted_dependency(tmp_path, "plugins/platforms/libqbroken.so")
    out = subprocess.run([sys.executable, "-m", "app", "--data-dir", str(tmp_path / "data")], capture_output=True,
                         text=True, timeout=120, env=_env(QT_QPA_PLATFORM="broken", QT_PLUGIN_PATH=str(tmp_path / "plugins")))
    assert out.returncode == 1, out.stderr
    assert "Qt's broken platform plugin can't load: missing libpagedeck-gone.so.1" in out.stderr
    assert "sudo dnf install" in out.stderr
    assert not (tmp_path / "data").exists()


@needs_ldd
def test_fallback_platform_that_loads_means_no_complaint():
    """QT_QPA_PLATFORM="broken;offscreen": Qt falls back to offscreen, so nothing is missing."""
    assert qt_libs.check({"QT_QPA_PLATFORM": "nonexistent;offscreen"}) is None


def test_platforms_qt_will_try():
    assert qt_libs.platforms_to_try({}) == ["xcb"]
    assert qt_libs.platforms_to_try({"XDG_SESSION_TYPE": "x11"}) == ["xcb"]
    assert qt_libs.platforms_to_try({"XDG_SESSION_TYPE": "wayland"}) == ["wayland", "xcb"]
    assert qt_libs.platforms_to_try({"QT_QPA_PLATFORM": "offscreen"}) == ["offscreen"]
    assert qt_libs.platforms_to_try({"QT_QPA_PLATFORM": "wayland;xcb:nomitshm"}) == ["wayland", "xcb"]


def test_install_commands_group_packages():
    assert qt_libs.install_commands(["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-xkb.so.1", "libxcb.so.1",
                                     "libxkbcommon-x11.so.0"]) == [
        "sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-xkb1 libxcb1 libxkbcommon-x11-0",
        "sudo dnf install xcb-util-cursor xcb-util-wm libxcb libxkbcommon-x11",
    ]


DPKG_INFO = Path("/var/lib/dpkg/info")


def _dpkg_owners(sonames) -> dict[str, set[str]]:
    """{soname: the packages that install a file of that name}, read from dpkg's file lists in one pass
    (what `dpkg -S` reads, ~100x faster than asking it about 36 names)."""
    owners: dict[str, set[str]] = {s: set() for s in sonames}
    for listing in DPKG_INFO.glob("*.list"):
        for line in listing.read_text(errors="replace").splitlines():
            name = line.rpartition("/")[2]
            if name in owners:
                owners[name].add(listing.stem.split(":")[0])
    return owners


@pytest.mark.skipif(not DPKG_INFO.is_dir(), reason="needs dpkg (Debian/Ubuntu) to check package names")
def test_debian_package_names_are_the_ones_that_hold_the_libraries():
    """Every installed soname in the table is owned by the package the table names (Ubuntu >= 24.04 renamed
    some to <name>t64, which still provides the old name); the others are packages apt knows."""
    owners = _dpkg_owners(qt_libs.PACKAGES)
    assert any(owners.values()), "dpkg owns none of the libraries: the query is broken"
    not_installed = sorted({deb for soname, (deb, _) in qt_libs.PACKAGES.items() if not owners[soname]})
    for soname, (deb, _rpm) in qt_libs.PACKAGES.items():
        if owners[soname]:
            assert owners[soname] & {deb, deb + "t64"}, f"{soname}: table says {deb}, dpkg says {owners[soname]}"
    if not not_installed:
        return
    policy = subprocess.run(["apt-cache", "policy", "libc6", *not_installed], capture_output=True, text=True).stdout
    candidates = dict(re.findall(r"^(\S+):\n\s+Installed: .*\n\s+Candidate: (\S+)", policy, re.M))
    if candidates.get("libc6", "(none)") == "(none)":
        pytest.skip(f"apt has no package lists (apt-get update first): can't check {not_installed}")
    assert [deb for deb in not_installed if candidates.get(deb, "(none)") == "(none)"] == [], policy


@needs_ldd
def test_readme_commands_cover_what_the_real_plugins_link():
    """The README's apt and dnf lines name the package of every table library the installed xcb and wayland
    plugins link (their whole tree, as ldd resolves it), so a user who runs them gets a loadable Qt."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    apt = set(re.search(r"sudo apt install (libdbus[^\n]*)", text).group(1).split())
    dnf = set(re.search(r"sudo dnf install (dbus-libs[^\n]*)", text).group(1).split())
    needed = set()
    for name in ("xcb", "wayland"):
        plugin = qt_libs.plugin_path(name, {})
        if plugin is None:
            continue
        out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True).stdout
        needed |= {line.split("=>")[0].strip() for line in out.splitlines() if "=>" in line}
    needed &= set(qt_libs.PACKAGES)
    assert needed, "ldd listed none of the known libraries"
    assert {qt_libs.PACKAGES[s][0] for s in needed} - apt == set()
    assert {qt_libs.PACKAGES[s][1] for s in needed} - dnf == set()

"""pagedeck as a desktop app: `--install-desktop` writes a valid .desktop entry and icons under XDG_DATA_HOME
(checked by desktop-file-validate, the freedesktop reference validator, and launched through GLib's own
desktop-entry launcher), and the running app tells Qt its desktop file name and window icon."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.window import desktop

ROOT = Path(__file__).resolve().parents[2]
needs_validator = pytest.mark.skipif(
    shutil.which("desktop-file-validate") is None,
    reason="needs desktop-file-validate: apt install desktop-file-utils (`make setup` does it where apt-get runs)")


def validate(path: Path) -> None:
    out = subprocess.run(["desktop-file-validate", str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and "error" not in out.stdout + out.stderr, out.stdout + out.stderr


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


@needs_validator
def test_install_desktop_writes_a_valid_entry_and_icons_under_xdg_data_home(tmp_path):
    xdg = tmp_path / "xdg data"
    out = subprocess.run([sys.executable, "-m", "app", "--install-desktop"], capture_output=True, text=True,
                         cwd=tmp_path, env=_env(XDG_DATA_HOME=str(xdg), HOME=str(tmp_path / "home")))
    assert out.returncode == 0, out.stderr
    entry = xdg / "applications" / "pagedeck.desktop"
    assert f"wrote {entry}" in out.stdout
    validate(entry)
    text = entry.read_text()
    assert f"Icon={desktop.APP_ID}\n" in text and f"StartupWMClass={desktop.APP_ID}\n" in text
    # The `pagedeck` script beside this interpreter (a venv or pipx install), else this python -m app.
    assert f"Exec={desktop.exec_value(desktop.launcher())}\n" in text
    assert not (tmp_path / "home").exists()  # XDG_DATA_HOME wins over ~/.local/share

    from PySide6.QtGui import QImage

    svg = xdg / "icons/hicolor/scalable/apps/pagedeck.svg"
    assert svg.read_bytes() == (desktop.ICONS / "pagedeck.svg").read_bytes()
    for n in desktop.PNG_SIZES:
        image = QImage(str(xdg / f"icons/hicolor/{n}x{n}/apps/pagedeck.png"))
        assert (image.width(), image.height()) == (n, n)

    out = subprocess.run([sys.executable, "-m", "app", "--uninstall-desktop"], capture_output=True, text=True,
                         cwd=tmp_path, env=_env(XDG_DATA_HOME=str(xdg)))
    assert out.returncode == 0 and f"removed {entry}" in out.stdout
    assert [p for p in xdg.rglob("*") if p.is_file()] == []


def test_default_data_home_is_dot_local_share(tmp_path):
    env = _env(HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", "from app.window.desktop import data_home; print(data_home())"],
                         capture_output=True, text=True, env=env)
    assert out.stdout.strip() == str(tmp_path / ".local" / "share")


@needs_validator
@pytest.mark.skipif(shutil.which("gio") is None, reason="needs gio (GLib's desktop-entry launcher, libglib2.0-bin)")
def test_exec_quoting_survives_a_real_launcher(tmp_path):
    """Arguments with spaces, quotes, $, backslashes, % and backticks reach the program unchanged when
    GLib parses and launches the entry (the spec's quoting and string escaping, applied in order)."""
    script = tmp_path / "with space" / "echo args.py"
    script.parent.mkdir()
    script.write_text("import json, sys\nopen(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))\n")
    result = tmp_path / "argv.json"
    args = ["a$b", 'q"t', "back\\slash", "50%", "tick`", "it's", "~", "x;y|z&"]
    entry = tmp_path / "t.desktop"
    entry.write_text(desktop.desktop_entry([sys.executable, str(script), str(result), *args]))
    validate(entry)
    subprocess.run(["gio", "launch", str(entry)], check=True, timeout=60, env=_env())
    deadline = time.monotonic() + 60  # gio spawns and returns; the child writes when it has run
    while not result.exists() or not result.read_text():
        assert time.monotonic() < deadline, "the launched program never ran"
        time.sleep(0.05)
    assert json.loads(result.read_text()) == args


def test_running_app_has_its_desktop_file_name_and_window_icon(tmp_path, tiny_llama_folder):
    """`pagedeck` itself (app.__main__.main, in its own process as users start it): the application and its
    main window carry the identity the desktop entry names."""
    probe = textwrap.dedent("""
        import json, sys
        from PySide6.QtCore import QSize, QTimer
        from PySide6.QtWidgets import QApplication
        from app.__main__ import main

        app = QApplication(sys.argv[:1])

        def probe():
            windows = [w for w in app.topLevelWidgets() if type(w).__name__ == "MainWindow"]
            if not windows:
                return
            timer.stop()
            icon = windows[0].windowIcon()
            print("PROBE " + json.dumps({
                "desktop_file": app.desktopFileName(), "name": app.applicationName(),
                "icon_sizes": sorted(s.width() for s in icon.availableSizes()),
                "pixmap": icon.pixmap(QSize(48, 48)).width()}), flush=True)
            windows[0].close()

        timer = QTimer()
        timer.timeout.connect(probe)
        timer.start(20)
        sys.exit(main(sys.argv[1:]))
    """)
    out = subprocess.run([sys.executable, "-c", probe, "--data-dir", str(tmp_path / "data"), "--model",
                          str(tiny_llama_folder)], capture_output=True, text=True, timeout=300,
                         env=_env(QT_QPA_PLATFORM="offscreen"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("PROBE "))
    seen = json.loads(line[len("PROBE "):])
    assert seen == {"desktop_file": "pagedeck", "name": "pagedeck", "icon_sizes": list(desktop.PNG_SIZES),
                    "pixmap": 48}

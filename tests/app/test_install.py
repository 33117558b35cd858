"""`pipx install .` / a wheel gives a working `pagedeck`: build the wheel from a copy of the sources,
install it (without deps) into a throwaway venv that borrows this venv's packages, and run the installed
command away from the checkout. Proves everything the app reads at run time is inside the package."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "engine", "kernels")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built offline (no build isolation: setuptools from this venv, the [test] extra) from a copy
    of the tree, so the build's scratch files never land in the checkout."""
    src = tmp_path_factory.mktemp("src")
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "screenshots")
    for name in (*PACKAGES, "resources"):
        shutil.copytree(ROOT / name, src / name, ignore=junk)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist)], check=True, capture_output=True, timeout=300, env=_env())
    (whl,) = dist.glob("pagedeck-*.whl")
    return whl


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QT_QPA_PLATFORM") and not k.startswith("XDG_")}
    env.update(extra)
    return env


def test_wheel_holds_every_module_and_runtime_resource(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        for module in (ROOT / package).rglob("*.py"):
            assert module.relative_to(ROOT).as_posix() in names
    for adapter in ("pirate", "bullets"):
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            assert f"resources/loras/{adapter}/{f}" in names
    icons = {p.relative_to(ROOT).as_posix() for p in (ROOT / "resources/icons").rglob("*") if p.is_file()}
    assert icons and icons <= names  # the window's icons and the message actions' icon set (icons/actions/)
    assert not [n for n in names if n.startswith(("tests/", "tools/", "resources/screenshots/"))]
    entry_points = zipfile.ZipFile(wheel).read("pagedeck-0.1.0.dist-info/entry_points.txt").decode()
    assert "pagedeck = app.__main__:main" in entry_points


def compiled_sources() -> list[str]:
    """What kernels/cpu_ext.py compiles at first use: its SOURCES and every header they include ("..."),
    followed through the headers, as paths from the checkout's root."""
    from kernels import cpu_ext

    todo, seen = [Path(p).resolve() for p in cpu_ext.SOURCES], set()
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo += [(path.parent / name).resolve()
                     for name in re.findall(r'^\s*#\s*include\s*"([^"]+)"', path.read_text(), re.MULTILINE)]
    return sorted(p.relative_to(ROOT).as_posix() for p in seen)


def test_wheel_holds_every_source_the_cpu_kernels_compile(wheel):
    """Without them the installed app cannot build its CPU kernels and runs on torch's slower paths, silently."""
    sources = compiled_sources()
    assert any(s.endswith(".h") for s in sources) and any(s.endswith(".cpp") for s in sources)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [s for s in sources if s not in names] == []


def test_installed_wheel_runs_pagedeck_away_from_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # This venv's third-party packages (torch, PySide6...) as a plain path: its .pth files, the editable
    # install of the checkout among them, are not processed, so only the wheel provides pagedeck.
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, timeout=300, env=_env())
    pagedeck = venv / "bin" / "pagedeck"

    out = subprocess.run([str(pagedeck), "--help"], capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=120)
    assert out.returncode == 0 and "--install-desktop" in out.stdout, out.stderr

    probe = ("import json, app, app.window.desktop as d\n"
             "from engine.contract.paths import demo_adapters_folder, find_adapters\n"
             "from kernels import cpu_ext\n"
             "print(json.dumps({'app': app.__file__, 'adapters': [p.name for p in find_adapters(demo_adapters_folder())],"
             " 'icons': sorted(p.name for p in d.ICONS.iterdir()), 'launcher': d.launcher(),"
             " 'kernel_sources': [str(p) for p in cpu_ext.SOURCES if p.is_file()]}))")
    seen = json.loads(subprocess.check_output([str(py), "-c", probe], text=True, cwd=tmp_path, env=_env(), timeout=120))
    assert Path(seen["app"]).is_relative_to(venv)
    assert seen["adapters"] == ["bullets", "pirate"]
    assert seen["icons"] == sorted(p.name for p in (ROOT / "resources/icons").iterdir())
    assert seen["launcher"] == [str(pagedeck)]
    from kernels import cpu_ext

    assert len(seen["kernel_sources"]) == len(cpu_ext.SOURCES)  # the installed kernels find their sources
    assert all(Path(p).is_relative_to(venv) for p in seen["kernel_sources"])

    xdg = tmp_path / "share"
    out = subprocess.run([str(pagedeck), "--install-desktop"], capture_output=True, text=True, cwd=tmp_path,
                         env=_env(XDG_DATA_HOME=str(xdg)), timeout=120)
    assert out.returncode == 0, out.stderr
    entry = (xdg / "applications" / "pagedeck.desktop").read_text()
    assert f"Exec={pagedeck}\n" in entry
    if shutil.which("desktop-file-validate"):
        check = subprocess.run(["desktop-file-validate", str(xdg / "applications" / "pagedeck.desktop")],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout

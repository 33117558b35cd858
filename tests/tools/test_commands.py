"""Every command the docs (docs/) show starts: `python -m tools.PACKAGE.NAME --help` and the engine's
benchmark commands answer with their usage (the full runs are smoke-tested by hand: they take minutes).

Which modules are commands follows from the layout (tools/__init__.py): every module of a tools subpackage whose
name has no leading underscore; the modules directly in tools/ and the underscored ones are helpers."""
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import tools

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(m.name for m in pkgutil.iter_modules(tools.__path__) if m.ispkg)
TOOLS = sorted(f"{package}.{m.name}" for package in PACKAGES
               for m in pkgutil.iter_modules(importlib.import_module(f"tools.{package}").__path__)
               if not m.name.startswith("_"))
# `make test-vllm`: its arguments go to pytest, and any run builds a ~3.5 GB venv first, so no --help here.
NO_HELP = {"peers.vllm_server"}


def test_tools_holds_packages_of_commands_and_shared_helpers():
    assert PACKAGES == ["bench", "docs", "models", "peers", "screenshots"]
    assert sorted(m.name for m in pkgutil.iter_modules(tools.__path__) if not m.ispkg) == [
        "ggml_writers", "logits", "processes", "simulated_workload"]


def test_every_command_is_named_in_its_package_docstring():
    """A package's docstring is where a reader learns what it holds: each command is named there."""
    for name in TOOLS:
        package, module = name.split(".")
        assert module in importlib.import_module(f"tools.{package}").__doc__, name


@pytest.mark.parametrize("command", [["tools." + name] for name in TOOLS if name not in NO_HELP]
                         + [["engine", "bench"], ["engine", "bench-spec"], ["engine", "bench-load"], ["engine", "generate"],
                            ["engine", "serve"], ["engine", "batch"], ["engine", "soak"]])
def test_command_starts(command):
    proc = subprocess.run([sys.executable, "-m", *command, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


@pytest.mark.parametrize("weights", ["auto", "dense", "packed", "q8", "q4"])
def test_every_weights_name_is_accepted_by_every_command(weights):
    """server_bench once defaulted to a name `engine serve` had stopped accepting: its servers exited at start."""
    from engine.cli import build_parser
    from tools.bench.server_bench import DEFAULT_WEIGHTS

    assert set(DEFAULT_WEIGHTS) <= {"auto", "dense", "packed", "q8", "q4"}
    for command in (["serve"], ["bench"], ["generate", "--prompt", "hi"]):
        assert build_parser().parse_args([*command, "--weights", weights]).weights == weights

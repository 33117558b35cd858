"""Every command the docs (docs/) show starts: `python -m tools.NAME --help` and the engine's
benchmark commands answer with their usage (the full runs are smoke-tested by hand: they take minutes)."""
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import tools

ROOT = Path(__file__).resolve().parents[2]
HELPERS = {"simulated_workload", "processes", "logits", "ggml_writers", "llamacpp_peer",
           "qgemm_bench", "q6_bench", "q8g_bench", "screenshot_images", "screenshot_session"}  # modules tools and tests import, not commands
TOOLS = sorted(m.name for m in pkgutil.iter_modules(tools.__path__) if m.name not in HELPERS)
# `make test-vllm`: its arguments go to pytest, and any run builds a ~3.5 GB venv first, so no --help here.
NO_HELP = {"vllm_server"}


def test_every_tool_is_listed_here():
    assert TOOLS == ["bench_big", "compare_screenshot", "compile_check", "cpu_time_peer", "dashboard_bench", "dequant_bench", "fake_hub",
                     "gil_wait_check",
                     "kernel_bench", "kv_quant_error", "loop_check", "lora_bench", "memory_table", "mmproj_gguf", "prompt_rows_bench", "qmatmul_bench",
                     "sampling_bench",
                     "screenshots", "screenshots_tools", "server_bench", "step_profile", "synthetic_gguf", "train_lora",
                     "vllm_server", "vlm_gguf", "weight_quality"]


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
    from tools.server_bench import DEFAULT_WEIGHTS

    assert set(DEFAULT_WEIGHTS) <= {"auto", "dense", "packed", "q8", "q4"}
    for command in (["serve"], ["bench"], ["generate", "--prompt", "hi"]):
        assert build_parser().parse_args([*command, "--weights", weights]).weights == weights

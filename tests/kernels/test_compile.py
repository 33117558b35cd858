"""Every Triton kernel must compile for a real GPU target (sm_90) even on a machine without one: the CPU
interpreter accepts things the compiler rejects (tl.dot shapes, mismatched return types). The attention
hot paths' launch configurations must also fit in registers without spilling. Runs
`python -m tools.bench.compile_check --quick` in a subprocess, since this suite's interpreter mode
(TRITON_INTERPRET=1) cannot compile."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_kernels_compile_for_sm90_without_spills_on_hot_paths():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tools.bench.compile_check", "--quick", "--arch", "90"],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines() if "spill_stack=" in ln}
    kinds = {name.split("[")[0] for name in lines}
    assert kinds == {"decode_stage1", "decode_stage2", "prefill", "write_kv", "rms_norm", "rotary", "silu_mul", "gelu_mul",
                     "dequant_gemv", "dequant_gemm", "lora_shrink", "lora_expand"}
    for name, line in lines.items():
        if name.startswith(("decode_stage1[fp16,fmt0", "prefill[fp16,fmt0")):
            assert re.search(r"spill_stack=0B", line), line

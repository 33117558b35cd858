"""The soak bench, short: 16 clients for 20 s against a real `python -m engine serve` on a tiny random model,
with an adapter loaded and unloaded during the run. Everything the bench does not ask for must be absent (no
5xx, no broken stream, no error outside OpenAI's shape), every page back at the end, the server healthy.
The 10-minute, 64-client run on the default model is `make soak` (figures in the README)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.test_lora import write_peft_adapter

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(400)


def test_sixteen_clients_for_twenty_seconds_leave_no_unasked_error_and_no_page(tiny_llama_folder, tmp_path):
    adapter = write_peft_adapter(tiny_llama_folder, tmp_path / "adapter")
    out = subprocess.run([sys.executable, "-m", "engine", "soak", "--model", str(tiny_llama_folder),
                          "--clients", "16", "--duration", "20", "--every", "5", "--threads", "1",
                          "--cache-tokens", "4096", "--adapter", str(adapter), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=360)
    lines = out.stdout.strip().splitlines()
    assert len(lines) >= 2, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(lines[-2])
    assert out.returncode == 0 and lines[-1] == "soak: OK", json.dumps(report, indent=1)[-4000:]
    assert report["unexpected_errors"] == 0 and report["served"] > 20
    assert report["pages_referenced_at_end"] == 0 and report["healthy_at_end"]
    asked = report["asked_errors"]
    assert asked.get("400 bad request", 0) > 0 and asked.get("dropped mid-stream", 0) > 0
    assert asked.get("cancelled", 0) > 0 and report["adapter_cycles"] >= 1
    assert report["ttft_p50_ms"] is not None and len(report["rss_mb"]) >= 4

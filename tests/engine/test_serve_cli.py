"""`python -m engine serve` as users start it: its own process, the embedded default model (no --model), packed
weights, the official `openai` client, then SIGTERM. The in-process server tests (test_server.py) share its
code but not its command line, which once crashed without --model."""
from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import openai
import pytest

from tools.processes import free_port, stop, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


def test_serve_command_answers_with_the_default_model_and_stops_on_sigterm():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--port", str(port), "--weights", "packed",
                             "--threads", "1", "--cache-tokens", "2048"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=300)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        model = client.models.list().data[0].id  # the served --model comes first; found models follow
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=12, temperature=0)
        assert "Paris" in reply.choices[0].message.content
        assert reply.usage.completion_tokens <= 12
        with urllib.request.urlopen(url + "/metrics") as r:
            assert "vllm:generation_tokens_total" in r.read().decode()
    finally:
        stop(proc)
    out = proc.stdout.read()
    assert proc.returncode == 0, out
    assert f"serving {model} at {url}/v1" in out

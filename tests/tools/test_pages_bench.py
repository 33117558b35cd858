"""tools.bench.pages_bench measures what it says on a tiny GGUF (figures are not checked: speed lives in the
benchmark): the reservation side never runs more chats than whole reservations fit and never preempts,
pagedeck runs more at once and still finishes every reply, and llama.cpp's slots stop at their share."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import DynamicGenerator, Model, PagedCache, Tokenizer
from tests.tiny_models import write_tiny_gguf
from tools.bench.pages_bench import PagedeckSide, chat_prompts, phases

ROOT = Path(__file__).resolve().parents[2]
PS = 16


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama_folder, tmp_path_factory):
    return write_tiny_gguf(tiny_llama_folder, tmp_path_factory.mktemp("pages") / "tiny-F32.gguf", "F32")


def test_reservation_rule_runs_fewer_chats_than_pages_on_demand(tiny_gguf):
    model, tok = Model.load(tiny_gguf), Tokenizer.load(tiny_gguf)
    prompts = chat_prompts(tok, 6)
    new = 24
    need = max(-(-(len(p) + new) // PS) for p in prompts)
    cache_pages = 2 * need  # two whole reservations
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=cache_pages * PS, page_size=PS), tok)
    reserved = PagedeckSide(gen, prompts, new, reserve=True).run()
    assert reserved["finished"] == 6 and reserved["tokens"] == 6 * new
    assert reserved["peak_running"] <= 2 and reserved["preemptions"] == 0
    on_demand = PagedeckSide(gen, prompts, new, reserve=False).run()
    assert on_demand["finished"] == 6 and on_demand["tokens"] == 6 * new
    assert on_demand["peak_running"] > 2
    assert reserved["ttft_p50_s"] <= reserved["ttft_p99_s"] and reserved["wall_s"] > 0


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs the peers extra (make peers)")
def test_llama_cpp_slots_stop_at_their_share_of_the_cache(tiny_gguf):
    """Two chats on 512 tokens: llama-server's slots hold 256 each, so 300-token replies stop short there;
    pagedeck's pool finishes both. In a process of its own (llama.cpp's library beside the suite's others)."""
    out = subprocess.run([sys.executable, "-m", "tools.bench.pages_bench", "--model", str(tiny_gguf), "--weights",
                          "dense", "--chats", "2", "--new-tokens", "300", "--cache-tokens", "512", "--repeats", "1",
                          "--threads", "1", "--sides", "pagedeck", "llama.cpp", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    lengths = [len(p) for p in chat_prompts(Tokenizer.load(tiny_gguf), 2)]
    llama, ours = result["medians"]["llama.cpp"], result["medians"]["pagedeck"]
    assert llama["finished"] == 0 and llama["tokens"] == sum(256 - n for n in lengths)
    assert ours["finished"] == 2 and ours["tokens"] == 600
    assert "llama-server -c 512 -np 2" in out.stdout and "command: python -m tools.bench.pages_bench" in out.stdout


def test_timeline_groups_steps_into_phases():
    steps = [(0.02, 2, 2), (0.02, 2, 2), (1.5, 3, 1), (0.03, 3, 3), (0.03, 3, 3), (0.01, 1, 1)]
    lines = phases(steps)
    assert len(lines) == 4
    assert lines[0].startswith("  2 running,     2 steps,") and "4 tokens" in lines[0]
    assert "gave no token" in lines[1] and "1 tokens" in lines[1]
    assert lines[2].startswith("  3 running,     2 steps,") and "6 tokens" in lines[2]
    assert "gave no token" not in lines[2] + lines[3]

"""Loading a GGUF of real vocabulary size holds about the file, no more: the peak resident set (VmHWM, file
pages included) while Model.load(weights="packed") runs and its weights settle stays within 1.3x the file and
what stays after within 1.05x; model and tokenizer loaded together add no more than the tokenizer's own keep.
Each load runs in a fresh process, its peak reset after the imports (/proc/self/clear_refs). The figures are
read once settling has ended: the settle thread runs at the lowest priority, so on busy cores a reading taken
as Model.load returns caught it anywhere (a peak half the estimate's, freed heap not yet given back)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tools.models.synthetic_gguf import write_random_gguf

MB = 1 << 20
TOKENIZER_KEEP = 128 * MB  # a 151,936-token BPE's vocabulary, merges and maps (measured: ~70 MB kept)

_PROBE = """
import ctypes, ctypes.util, json, sys
import torch, engine
from engine.model.model import Model
from engine.model.model_and_tokenizer import load_model_and_tokenizer

def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak so far (the imports') forgotten
base = status()["VmRSS"]
if sys.argv[2] == "model":
    loaded = Model.load(sys.argv[1], weights="packed")
elif sys.argv[2] == "tokenizer":
    loaded = engine.Tokenizer.load(sys.argv[1])
else:
    loaded = load_model_and_tokenizer(sys.argv[1], weights="packed")
model = loaded if isinstance(loaded, Model) else loaded[0] if isinstance(loaded, tuple) else None
if model is not None:  # the model starts on the mapped file; its weights settle behind it, at the lowest priority
    model.wait_settled()
    if model.settle_thread is not None:
        model.settle_thread.join()  # it gives back what it freed as it ends
now = status()
ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)  # what the heap still held of what the load freed
print(json.dumps({"peak": now["VmHWM"] - base, "after": now["VmRSS"] - base,
                  "trimmable": now["VmRSS"] - status()["VmRSS"]}))
"""


@pytest.fixture(scope="module")
def real_vocab_file(tmp_path_factory):
    """Qwen 2.5's vocabulary size (151,936 tokens, a 257-byte merge) over 2 layers of Gemma-3-270M's
    shapes in Q8_0: ~226 MB, most of it the embedding and the head."""
    return write_random_gguf(tmp_path_factory.mktemp("rss") / "bpe-270m.gguf", "gemma3-270m", 2, "Q8_0",
                             tokenizer="bpe")


def _probe(path, what: str) -> dict:
    run = subprocess.run([sys.executable, "-c", _PROBE, str(path), what], capture_output=True, text=True)
    if run.returncode and "clear_refs" in run.stderr:
        pytest.skip("this kernel does not let a process reset its peak resident set")
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_model_load_peaks_near_the_file(real_vocab_file):
    size = real_vocab_file.stat().st_size
    rss = _probe(real_vocab_file, "model")
    assert rss["peak"] <= 1.3 * size, f"peak {rss['peak'] / size:.2f}x the file"
    assert rss["after"] <= 1.05 * size + 16 * MB, f"after loading {rss['after'] / size:.2f}x the file"


def test_model_and_tokenizer_peak_adds_only_the_tokenizer(real_vocab_file):
    size = real_vocab_file.stat().st_size
    rss = _probe(real_vocab_file, "both")
    assert rss["peak"] <= 1.3 * size + TOKENIZER_KEEP, f"peak {rss['peak'] / size:.2f}x the file"


@pytest.mark.parametrize("what", ["tokenizer", "both"])
def test_a_load_leaves_no_freed_heap_resident(real_vocab_file, what):
    """The tokenizer's build frees its token and merge lists (~45 MB for this vocabulary); glibc kept ~20 MB of
    them resident for good until the load gave them back (malloc_trim)."""
    rss = _probe(real_vocab_file, what)
    assert rss["trimmable"] <= 4 * MB, f"{rss['trimmable'] / MB:.1f} MB of freed heap still resident"


def test_the_estimates_load_peak_is_the_measured_peak_of_loading(real_vocab_file):
    """The estimate's peak of loading (weights as built, the file's pages in use, the tokenizer) is what a
    fresh process's VmHWM shows for model and tokenizer loaded together, within 15%."""
    from engine import estimate_memory

    est = estimate_memory(real_vocab_file, weights="packed", cache_tokens=256)
    rss = _probe(real_vocab_file, "both")
    assert abs(est.load_peak_bytes - rss["peak"]) <= 0.15 * rss["peak"], \
        f"estimated {est.load_peak_bytes / MB:.0f} MB, measured {rss['peak'] / MB:.0f} MB"
    assert est.load_peak_bytes > est.weights_bytes  # the tokenizer is loaded beside the weights
    assert "loading peaks at" in est.summary()

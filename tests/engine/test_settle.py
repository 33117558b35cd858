"""A GGUF whose packed matrices the kernels read as the file stores them starts on the mapped file (engine.model.
settle): Model.load copies nothing, the model answers from the file's pages, and its weights settle into their
kernel layouts in the background, layer by layer. The oracle is the same file loaded with everything moved
first (PAGEDECK_MAPPED_START=0): before, during and after settling every step gives its bits, and once settled
the layers are its layers and the file's pages are no longer held."""

import gc
import subprocess
import sys
import threading
import time
import weakref

import pytest
import torch

import kernels
from engine import Model
from engine.cache.paged_cache import PagedCache
from engine.model import huge_pages, settle
from engine.model.batch import Batch
from engine.model.packing.move_queue import MoveQueue
from engine.model.qlinear import PackedLinear, PartsLinear
from kernels import cpu_ext
from tools.models.synthetic_gguf import write_random_gguf

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


@pytest.fixture(scope="module", params=["Q4_K_M", "IQ4_XS", "Q8_0", "gemma-like", "qwen2-Q4_K_M"])
def path(tmp_path_factory, request):
    folder = tmp_path_factory.mktemp(f"settle-{request.param}")
    if request.param == "gemma-like":  # 640-wide rows: Q5_0 q/k/gate/up, Q5_0 or Q8_0 v, tied Q8_0 embedding head
        return write_random_gguf(folder / "g.gguf", "gemma3-270m", 2, "Q4_K_M", tied=True)
    if request.param.startswith("qwen2"):  # q|k|v biases, q/k rows as stored (views of the file, no copy)
        from tests.tiny_models import WIDE, q4_k_m, write_tiny_gguf, write_tiny_model

        hf = write_tiny_model(folder / "hf", "qwen2", tie=False, tokenizer=False, vocab_size=512, weight_std=0.125,
                              **WIDE)
        return write_tiny_gguf(hf, folder / "qwen2.gguf", q4_k_m, tokenizer=False)
    # llama.cpp's recipe over 8 layers (attn_v Q6_K in some: mixed q|k|v); llama's q/k rows are unpermuted copies
    return write_random_gguf(folder / "m.gguf", "tiny-256", 8, request.param)


@pytest.fixture(autouse=True)
def no_dense_copy(monkeypatch):
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")  # prompt rows packed, as in a model too big for the copy


def file_ranges(path) -> list[tuple[int, int]]:
    """This process's mappings of the file: (start, end) addresses."""
    out = []
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith(str(path)):
            lo, hi = line.split()[0].split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


def file_rss(path) -> int:
    """Bytes of the file's mappings resident in this process (smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if "-" in line.split()[0] and len(line.split()) >= 5:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def matrices(model: Model) -> list[PackedLinear]:
    """Every packed matrix (each part of a PartsLinear) of the layers and the head."""
    out = []
    for w in [t for layer in model.layers for t in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [model.lm_head]:
        out += w.parts if isinstance(w, PartsLinear) else [w]
    return out


def in_file(t: torch.Tensor, ranges) -> bool:
    return any(lo <= t.data_ptr() < hi for lo, hi in ranges)


def steps(model: Model, n: int = 4) -> list[torch.Tensor]:
    """A 9-token prefill and n decode steps' logits."""
    cache, ids, out = PagedCache(model, max_tokens=64, page_size=16), list(range(3, 12)), []
    out.append(model.forward(Batch.build([(ids, 0, [0])], 16, [len(ids)]), cache))
    for step in range(n):
        at = len(ids) + step
        out.append(model.forward(Batch.build([([20 + step], at, [0])], 16, [1], prompt_seqs=[False]), cache))
    return out


def settled_reference(path, monkeypatch) -> Model:
    monkeypatch.setenv("PAGEDECK_MAPPED_START", "0")
    ref = Model.load(path, weights="packed")
    monkeypatch.delenv("PAGEDECK_MAPPED_START")
    assert ref.settled_event.is_set() and not any(in_file(m.blocks[0], file_ranges(path)) for m in matrices(ref))
    return ref


def held_load(path, monkeypatch) -> tuple[Model, settle.Settling]:
    """Model.load with its settling held back, to be run by the test."""
    held = []
    monkeypatch.setattr(settle, "in_background", lambda model, settling: held.append(settling))
    model = Model.load(path, weights="packed")
    monkeypatch.undo()
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    assert held and held[0] is not None, "the model did not start on its mapped file"
    return model, held[0]


def test_starts_on_the_file_and_settles_to_the_same_bits(path, monkeypatch):
    ref = settled_reference(path, monkeypatch)
    model, settling = held_load(path, monkeypatch)
    ranges = file_ranges(path)
    assert not model.settled_event.is_set()
    on_file = [in_file(m.blocks[0], ranges) for m in matrices(model)]
    copies = 2 * len(model.layers) if path.name != "qwen2.gguf" else 0  # llama files' q and k rows: unpermuted copies
    assert on_file.count(False) == copies, "the model did not start on the file's own rows"
    # its decode steps take the all-layers call on the file's rows too (gate|up in parts, SwiGLU apart)
    assert model.decode_stack is not None and all(layer.gate_up.__class__ is PartsLinear for layer in model.layers)
    calls = []
    real = kernels.decode_layers
    monkeypatch.setattr(kernels, "decode_layers", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = steps(model)
    assert len(calls) == 5, "the steps on the file's rows did not take the all-layers decode"
    assert all(torch.equal(a, b) for a, b in zip(got, steps(ref)))  # every page of the file read
    monkeypatch.undo()
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")

    resident = []  # the file's resident bytes as each part is handed over: a settled part's pages are let go
    adopt = model.adopt
    monkeypatch.setattr(model, "adopt", lambda part, weights: resident.append(file_rss(path)) or adopt(part, weights))
    gone = weakref.ref(settling)
    held = [settling]
    del settling
    settle._settle(weakref.ref(model), held)
    assert gone() is None, "settling ended but kept what the model started on (its heap could not go back to the OS)"
    assert len(resident) == len(model.layers) + 1 and resident == sorted(resident, reverse=True)
    assert resident[-1] < resident[0] / 2, f"resident file bytes as the parts settled: {resident}"
    assert model.wait_settled(0)
    assert not any(in_file(m.blocks[0], ranges) for m in matrices(model))
    assert [type(m).__name__ for m in matrices(model)] == [type(m).__name__ for m in matrices(ref)]
    assert [getattr(m, "grouped", None) for m in matrices(model)] == [getattr(m, "grouped", None) for m in matrices(ref)]
    assert model.decode_stack is not None and model.decode_stack[1:] == ref.decode_stack[1:]
    assert all(torch.equal(a, b) for a, b in zip(steps(model), steps(ref)))
    assert file_rss(path) <= 4 << 20  # the header's pages (the map goes with the last view: below)
    gc.collect()
    assert file_rss(path) == 0 and not file_ranges(path), "the file is still mapped after settling"


def paced(monkeypatch, seconds: float) -> None:
    """Each settling segment followed by a pause, so that steps run while the layers settle one by one."""
    real = MoveQueue.run_segment

    def run_segment(self, start, end, solo=False):
        real(self, start, end, solo)
        time.sleep(seconds)

    monkeypatch.setattr(MoveQueue, "run_segment", run_segment)


def test_steps_while_settling_give_the_settled_bits(path, monkeypatch):
    want = steps(settled_reference(path, monkeypatch), 2)
    # in lockstep: one tensor's moves (and the hand-over they complete) after each round of steps, so that the
    # steps meet every mix of settled and unsettled layers
    go, moved = threading.Semaphore(0), threading.Semaphore(0)
    real = MoveQueue.run_segment

    def run_segment(self, start, end, solo=False):
        go.acquire(timeout=30)
        real(self, start, end, solo)
        moved.release()

    monkeypatch.setattr(MoveQueue, "run_segment", run_segment)
    model = Model.load(path, weights="packed")
    assert model.settle_thread is not None
    seen = set()
    while not model.settled_event.is_set():
        seen.add(sum(isinstance(layer.gate_up, PartsLinear) for layer in model.layers))  # layers not yet settled
        assert all(torch.equal(a, b) for a, b in zip(steps(model, 2), want))
        go.release()
        while not moved.acquire(timeout=0.05) and not model.settled_event.is_set():
            pass
    assert set(range(1, len(model.layers) + 1)) <= seen, f"steps saw {sorted(seen)} layers unsettled"
    assert all(torch.equal(a, b) for a, b in zip(steps(model, 2), want))


def test_moves_and_collapse_run_at_the_lowest_priority(path, monkeypatch):
    """The moves and the 2 MB collapses copy bytes; beside a decode step on two cores they slowed its steps 2-7x
    at normal priority, so the thread runs at nice 19 (the caller's priority left alone) and on its own, never
    handing pieces to the shared helpers."""
    import os

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen = {"moves": set(), "collapse": set(), "solo": set()}
    real = MoveQueue.run_segment

    def run_segment(self, start, end, solo=False):
        seen["moves"].add(nice())
        seen["solo"].add(solo)
        real(self, start, end, solo)

    monkeypatch.setattr(MoveQueue, "run_segment", run_segment)
    monkeypatch.setattr(huge_pages, "collapse", lambda ranges: seen["collapse"].add(nice()))
    ours = nice()
    model = Model.load(path, weights="packed")
    model.settle_thread.join(timeout=60)
    assert seen == {"moves": {19}, "collapse": {19}, "solo": {True}} and nice() == ours


def test_a_model_dropped_while_settling_stops_it_and_is_freed(path, monkeypatch):
    paced(monkeypatch, 0.05)
    model = Model.load(path, weights="packed")
    thread, ref = model.settle_thread, weakref.ref(model)
    del model
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive() and ref() is None


_EXIT = """
import os, sys, time
os.environ["PAGEDECK_DENSE_COPY"] = "0"
from engine import Model
from engine.model.packing.move_queue import MoveQueue
real = MoveQueue.run_segment
def slow(self, start, end, solo=False):
    real(self, start, end, solo)
    time.sleep(0.05)
MoveQueue.run_segment = slow
model = Model.load(sys.argv[1], weights="packed")
assert not model.settled_event.is_set()
print("exiting while settling")
"""


def test_exit_while_settling_is_clean(path):
    """A daemon thread woken inside a C++ call while the interpreter finalizes aborted the process ("terminate
    called without an active exception"): the settling stops at exit after the tensor in hand."""
    run = subprocess.run([sys.executable, "-c", _EXIT, str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "exiting while settling" in run.stdout, run.stderr[-2000:]
    assert "terminate" not in run.stderr


@pytest.mark.parametrize("quant,dense_copy", [("Q4_0", "0"), ("Q4_K_M", "auto")])
def test_other_loads_move_everything_first(tmp_path, monkeypatch, quant, dense_copy):
    """Q4_0 is repacked (its kernel layout is not the file's, and no kernel reads it as stored), and a model
    keeping dense prompt rows keeps no parts: these loads move everything before Model.load returns."""
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", dense_copy)
    path = write_random_gguf(tmp_path / "m.gguf", "tiny-256", 2, quant)
    model = Model.load(path, weights="packed")
    assert model.settled_event.is_set()
    assert not any(in_file(m.blocks[0], file_ranges(path)) for m in matrices(model))

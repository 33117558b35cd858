"""What a loaded GGUF holds: the estimate's weight figure is the storage the model really keeps; a tied
table is held once; an untied embedding stays the file's blocks; the mapped file is let go after loading;
without the dense copy for prompt rows a file loads in about its own size."""

import gc
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from engine import Model
from engine.model.catalog import memory
from engine.model.packing import repack
from engine.model.embedding import GGMLRows
from engine.model.qlinear import PackedLinear
from engine.model.gguf.file import GGUFFile
from tools.models.synthetic_gguf import write_random_gguf


def settled(model: Model) -> Model:
    """The model once its weights have settled and its settling has ended (a model started on its mapped file,
    engine.model.settle, holds views of the file until then): the layout the estimate describes."""
    if model.settle_thread is not None:
        model.settle_thread.join(120)
    gc.collect()
    return model


def storages(model: Model) -> list[torch.UntypedStorage]:
    """Every storage behind the model's weights, once per weight object that holds it (so a table held by
    both the embedding and the head, if it were held twice, shows up twice)."""
    out = []
    for t in [model.embed, model.lm_head, model.norm] + [w for layer in model.layers for w in layer.weights()]:
        if isinstance(t, PackedLinear):
            parts = [*t.blocks, t.dense]
        elif isinstance(t, GGMLRows):
            parts = [t.raw]
        else:
            parts = [t]
        out += [p.untyped_storage() for p in parts if p is not None]
    return out


def unique_bytes(model: Model) -> int:
    return sum({s.data_ptr(): s.nbytes() for s in storages(model)}.values())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Tiny synthetic GGUFs: untied Q4_K_M (its K-quants falling back on 64-wide rows, as llama.cpp's do),
    tied Q8_0 with a padded vocabulary, tied Q4_0."""
    d = tmp_path_factory.mktemp("mem")
    return {
        "untied-q4_k_m": write_random_gguf(d / "a.gguf", "tiny", 2, "Q4_K_M"),
        "tied-q8_0": write_random_gguf(d / "b.gguf", "tiny", 2, "Q8_0", vocab=50_000, pad_vocab=True, tied=True),
        "tied-q4_0": write_random_gguf(d / "c.gguf", "tiny", 2, "Q4_0", tied=True),
    }


@pytest.mark.parametrize("dense_copy", ["on", "off"])
@pytest.mark.parametrize("name", ["untied-q4_k_m", "tied-q8_0", "tied-q4_0"])
def test_estimate_is_the_storage_loading_keeps(files, name, dense_copy, monkeypatch):
    if dense_copy == "off":
        monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    path = files[name]
    est = memory.estimate_memory(path, weights="auto")
    model = settled(Model.load(path, weights="auto"))
    actual = unique_bytes(model)
    assert abs(est.weights_bytes - actual) <= 0.1 * actual  # the promise; in fact byte for byte:
    assert est.weights_bytes == actual == model.memory_bytes()
    down = model.layers[0].down
    dense_prompts = down.dense is not None or down.jit_dense  # a kept copy, or exact weights decoded just in time
    assert dense_prompts == (dense_copy == "on")  # a tiny model's prompt rows take dense weights unless off
    if dense_copy == "off":
        assert actual <= 1.3 * path.stat().st_size, (actual, path.stat().st_size)


@pytest.mark.parametrize("name", ["tied-q8_0", "tied-q4_0"])
def test_tied_head_is_stored_once_and_serves_the_lookups(files, name, monkeypatch):
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    model = settled(Model.load(files[name], weights="auto"))
    assert model.embed is model.lm_head and isinstance(model.lm_head, PackedLinear)
    all_refs = storages(model)  # lists the embedding's parts and the head's: the same storages
    head_parts = [p for p in [*model.lm_head.blocks, model.lm_head.dense] if p is not None]
    assert len(all_refs) - len({s.data_ptr() for s in all_refs}) == len(head_parts)  # nothing else shared
    table = model.lm_head.nbytes()
    assert model.memory_bytes() == sum({s.data_ptr(): s.nbytes() for s in all_refs}.values())
    assert sum(s.nbytes() for s in all_refs) - model.memory_bytes() >= table  # counting it twice would add it
    # the lookups are the head's quantized rows, which for Q8_0 and Q4_0 are the file's rows exactly
    ids = torch.tensor([[0, 5, 49_151, model.vocab_size - 1]])
    gf = GGUFFile(files[name])
    t = next(t for t in gf.tensors if t.name == "token_embd.weight")
    rows = gguf_dequantize(gf.raw("token_embd.weight")[ids.reshape(-1)].numpy(), t.tensor_type)
    torch.testing.assert_close(model.embedding(ids)[0], torch.from_numpy(np.ascontiguousarray(rows)), atol=0, rtol=0)


def test_untied_embedding_is_the_files_rows(files):
    model = Model.load(files["untied-q4_k_m"], weights="auto")
    assert isinstance(model.embed, GGMLRows) and model.embed.dense is None
    gf = GGUFFile(files["untied-q4_k_m"])
    raw = gf.raw("token_embd.weight")
    assert torch.equal(model.embed.raw, raw) and model.embed.raw.untyped_storage().nbytes() == raw.numel()
    ids = torch.tensor([3, 3, 40_000, 17])
    want = gguf_dequantize(raw[ids].numpy(), model.embed.qtype).reshape(len(ids), -1)
    torch.testing.assert_close(model.embedding(ids), torch.from_numpy(want), atol=0, rtol=0)


def test_loaded_model_keeps_no_mapping_of_its_file(files, monkeypatch):
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    path = files["untied-q4_k_m"]
    model = settled(Model.load(path, weights="auto"))
    with open("/proc/self/maps") as f:
        assert str(path) not in f.read()
    assert model.memory_bytes() < 2 * path.stat().st_size  # no storage views the whole file


def test_dense_f16_head_is_packed_without_an_fp32_copy_unless_the_rule_keeps_one(tmp_path, monkeypatch):
    from tests.tiny_models import write_tiny_gguf, write_tiny_model

    folder = write_tiny_model(tmp_path / "w", "llama", tie=False, hidden_size=256, intermediate_size=512, head_dim=64)
    path = write_tiny_gguf(folder, tmp_path / "f16-head.gguf", lambda n: "F16" if n == "output.weight" else "Q4_0",
                           tokenizer=False)
    for copy in ("1", "0"):
        monkeypatch.setenv("PAGEDECK_DENSE_COPY", copy)
        model = Model.load(path, weights="auto")
        assert model.lm_head.format == "q8" and (model.lm_head.dense is not None) == (copy == "1")
        assert memory.estimate_memory(path, weights="auto").weights_bytes == model.memory_bytes()
        assert isinstance(model.embed, GGMLRows) and model.embed.qtype == GGMLQuantizationType.Q4_0


def test_dense_copy_switch_is_read_by_the_rule(monkeypatch):
    assert repack.keeps_dense_copy(1000)
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "off")
    assert not repack.keeps_dense_copy(1000)


def _rss_kb() -> dict[str, int]:
    """This process's resident set split into anonymous and file-backed pages (/proc/self/smaps_rollup), in kB."""
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Rss", "Anonymous"):
                out[key] = int(value.split()[0])
    return {"anon": out["Anonymous"], "file": out["Rss"] - out["Anonymous"]}


def test_loading_leaves_no_file_pages_and_no_second_copy_resident(files, tmp_path, monkeypatch):
    """After loading, the file's pages are out of the resident set (copied or packed, then dropped or unmapped)
    and the anonymous memory added is the packed weights, not weights plus the file's rows held twice."""
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    Model.load(files["tied-q4_0"], weights="auto")  # kernels and lazy imports mapped before the baseline
    path = write_random_gguf(tmp_path / "big.gguf", "tiny-256", 2, "Q8_0", vocab=60_000, pad_vocab=True)  # ~35 MB, untied head
    size_kb = path.stat().st_size // 1024
    gc.collect()
    before = _rss_kb()
    model = settled(Model.load(path, weights="auto"))
    after = _rss_kb()
    assert after["file"] - before["file"] < 0.05 * size_kb  # the file's pages are not left resident
    weights_kb = model.memory_bytes() // 1024
    assert after["anon"] - before["anon"] < weights_kb + 0.1 * size_kb  # no second copy kept beside the packed one

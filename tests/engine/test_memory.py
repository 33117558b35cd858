"""The memory estimate (engine.memory) from headers alone: its weight and cache terms are what loading
really allocates, and a model that will not fit is refused before loading, with the numbers and advice."""

import pytest
import torch

from engine import Model, PagedCache
from engine.model.catalog import memory
from engine.model.catalog.info import read_model_info
from engine.model.weights import default_model_path
from tests.tiny_models import q4_k_m, write_tiny_gguf, write_tiny_model


@pytest.mark.parametrize("weights", ["dense", "packed"])
def test_weight_estimate_is_what_loading_allocates(weights):
    est = memory.estimate_memory(default_model_path(), cache_tokens=512, weights=weights)
    model = Model.load(weights=weights, check_memory=False)
    assert est.weights_bytes == model.memory_bytes()
    assert est.weights == weights and est.file_bytes == default_model_path().stat().st_size


@pytest.mark.parametrize("dense_copy", [True, False])
def test_weight_estimate_matches_a_q4_k_m_gguf_and_a_q8_folder(tmp_path, monkeypatch, dense_copy):
    """Byte for byte, with the dense copy for prompt rows (small models) and without it (big ones)."""
    from engine.model.packing import repack

    if not dense_copy:
        monkeypatch.setattr(repack, "DENSE_COPY_MAX_BYTES", 0)
    folder = write_tiny_model(tmp_path / "w", "llama", tie=False, hidden_size=256, intermediate_size=512, head_dim=64)
    path = write_tiny_gguf(folder, tmp_path / "m.gguf", q4_k_m, tokenizer=False)
    assert memory.estimate_memory(path, weights="auto").weights_bytes == Model.load(path, weights="auto").memory_bytes()
    assert memory.estimate_memory(folder, weights="q8").weights_bytes == Model.load(folder, weights="q8").memory_bytes()
    assert memory.estimate_memory(folder, weights="dense").weights_bytes == Model.load(folder, weights="dense").memory_bytes()


@pytest.mark.parametrize("kv_quant", [None, "q8", "q6", "q4"])
def test_cache_estimate_is_the_pools_size(tiny_llama_folder, kv_quant):
    model = Model.load(tiny_llama_folder)
    cache = PagedCache(model, max_tokens=1024, page_size=256, kv_quant=kv_quant)
    assert memory.kv_cache_bytes(model.config, 1024, kv_quant, 4) == cache.memory_bytes()


@pytest.mark.parametrize("weights,pool", [("dense", torch.float32), ("q8", torch.float16)])
def test_cache_estimate_follows_the_pools_element_type(tiny_llama_folder, weights, pool):
    """Packed weights on a CPU keep fp16 pools: the tokens asked for stay the tokens held, at half the bytes
    each, and the estimate the app shows is what the cache allocates."""
    model = Model.load(tiny_llama_folder, weights=weights)
    cache = PagedCache(model, max_tokens=1024)
    assert cache.k[0].dtype == pool and cache.max_tokens == 1024
    assert memory.estimate_memory(tiny_llama_folder, cache_tokens=1024, weights=weights).cache_bytes == cache.memory_bytes()


def test_too_large_is_refused_before_loading_with_numbers_and_advice(monkeypatch, tiny_llama_folder):
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 1500 << 20)
    est = memory.estimate_memory(default_model_path(), cache_tokens=32768, weights="dense")
    assert est.fits is False
    msg = est.message()
    for part in ("will not fit", "GiB", "weights", "KV cache", "32,768 tokens", "free", "weights='auto'",
                 "smaller cache", "quantized KV cache"):
        assert part in msg, (part, msg)
    with pytest.raises(memory.ModelTooLarge, match="will not fit"):
        memory.check_fits(default_model_path(), cache_tokens=32768, weights="dense")
    allocated = []
    monkeypatch.setattr("engine.model.loader.load_checkpoint", lambda *a, **k: allocated.append(1))
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 700 << 20)  # not even the weights
    with pytest.raises(memory.ModelTooLarge):
        Model.load(weights="dense")  # refused from the header, before reading any tensor
    assert not allocated
    hf = memory.estimate_memory(tiny_llama_folder, cache_tokens=32768, weights="dense")
    assert "weights='q8'" in hf.suggestion() and "Q4_K_M GGUF" in hf.suggestion()


def test_fits_when_memory_is_plenty_and_unknown_passes(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 64 << 30)
    assert memory.check_fits(default_model_path(), cache_tokens=8192).fits is True
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": None)
    assert memory.check_fits(default_model_path(), cache_tokens=8192).fits is None


def test_available_bytes_reads_this_machine():
    free = memory.available_bytes("cpu")
    assert free is not None and 0 < free < 1 << 50


def test_model_info_reads_headers_only():
    info = read_model_info(default_model_path())
    assert info.supported and info.kind == "gguf" and info.arch == "llama" and info.quant == "Q4_1"
    assert abs(info.params - Model.load(check_memory=False).num_parameters()) < 1000  # rope/norm bookkeeping aside
    assert info.config.num_layers == 30 and info.file_bytes == default_model_path().stat().st_size


def test_cache_too_large_for_memory_is_refused_clearly(monkeypatch, tiny_llama_folder):
    model = Model.load(tiny_llama_folder)
    monkeypatch.setattr("engine.cache.paged_cache.available_bytes", lambda device="cpu": 1 << 20)
    with pytest.raises(MemoryError, match=r"KV cache of 65,536 tokens .* needs .* GiB .*quantized KV cache"):
        PagedCache(model, max_tokens=65536, page_size=256)

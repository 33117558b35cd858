"""PagedCache: geometry, quantized pools, and the generator running on them."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from tests.engine.test_generator import naive_greedy, prompt_ids, run_all


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder):
    return Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)


def test_geometry_and_errors(tiny):
    model, _ = tiny
    cache = PagedCache(model, max_tokens=1000, page_size=64)
    assert cache.num_pages == 15 and cache.max_tokens == 960
    with pytest.raises(ValueError, match="power of two"):
        PagedCache(model, 256, page_size=48)
    with pytest.raises(ValueError, match="kv_quant"):
        PagedCache(model, 256, 16, kv_quant="q3")
    with pytest.raises(ValueError, match="at least one page"):
        PagedCache(model, 8, 16)


def test_cache_is_built_from_a_spec_and_refused_by_a_different_model(tiny):
    """A cache keeps its model's CacheSpec, never the model; a generator refuses a cache of another spec."""
    model, tok = tiny
    spec = model.cache_spec()
    cache = PagedCache(spec, 256, 16)
    assert cache.spec == spec and PagedCache(model, 256, 16).spec == spec
    assert not any(v is model for v in vars(cache).values())
    DynamicGenerator(model, cache, tok)  # a cache of an equal spec serves the model
    other = PagedCache(dataclasses.replace(spec, num_layers=spec.num_layers + 1), 256, 16)
    with pytest.raises(ValueError, match="different model"):
        DynamicGenerator(model, other, tok)


@pytest.mark.parametrize("fmt", ["q8", "q6", "q4"])
def test_quantized_cache_is_smaller_and_generates(tiny, fmt):
    model, tok = tiny
    plain = PagedCache(model, 512, 16)
    quant = PagedCache(model, 512, 16, kv_quant=fmt)
    assert quant.memory_bytes() < plain.memory_bytes() / 3
    gen = DynamicGenerator(model, quant, tok)
    ids = prompt_ids(40, 41)
    (toks,), _ = run_all(gen, [DynamicJob(ids, 12, gen_settings=SamplerSettings.greedy())])
    (again,), (fin,) = run_all(gen, [DynamicJob(ids, 12, gen_settings=SamplerSettings.greedy())])
    assert fin["cached_tokens"] == 39 and again == toks  # prefix reuse works on quantized pages
    if fmt == "q8":  # 8-bit K/V keeps the tiny model's greedy path
        assert toks == naive_greedy(model, ids, 12)


def test_quantized_partial_page_copy(tiny):
    model, tok = tiny
    gen = DynamicGenerator(model, PagedCache(model, 512, 16, kv_quant="q8"), tok)
    ids = prompt_ids(40, 42)
    run_all(gen, [DynamicJob(ids, 4, gen_settings=SamplerSettings.greedy())])
    branch = torch.cat([ids[:, :37], prompt_ids(6, 43)], dim=1)  # shares 2 full pages + 5 tokens of the third
    (toks,), (fin,) = run_all(gen, [DynamicJob(branch, 6, gen_settings=SamplerSettings.greedy())])
    assert fin["cached_tokens"] == 37
    (cold,), _ = run_all(DynamicGenerator(model, PagedCache(model, 512, 16, kv_quant="q8"), tok),
                         [DynamicJob(branch, 6, gen_settings=SamplerSettings.greedy())])
    assert toks == cold

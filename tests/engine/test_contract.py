"""engine.contract: torch-free, and the engine keeps to what it promises (formats, results, metrics keys)."""
from __future__ import annotations

import subprocess
import sys
import typing

import pytest

from engine.contract import (
    CACHED, EOS_REASONS, FREE, KV_QUANT_FORMATS, METRICS_KEYS, STAGES, WEIGHT_FORMATS, InvalidSetting,
    SamplerSettings, StreamingResult, check_lora_pairs, check_page_size,
)


def _run(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True)


def test_contract_and_lazy_engine_package_never_import_torch():
    _run("import sys; import engine, engine.contract; from engine import SamplerSettings; "
         "SamplerSettings().validate(); "
         "assert 'engine.contract' in sys.modules; "
         "bad = [m for m in ('torch', 'numpy', 'triton', 'kernels', 'engine.model') if m in sys.modules]; "
         "assert not bad, bad")


def test_engine_package_exports_load_on_first_use():
    _run("import sys, engine; assert 'torch' not in sys.modules; "
         "engine.DynamicGenerator; assert 'torch' in sys.modules; "
         "assert set(engine.__all__) <= set(dir(engine))")


def test_engine_formats_are_the_contracts():
    import kernels
    from engine.cache.paged_cache import PagedCache  # noqa: F401  (the engine module that checks kv_quant)

    assert set(KV_QUANT_FORMATS) - {None} == set(kernels.KV_QUANT_FORMATS)
    assert "auto" in WEIGHT_FORMATS and "dense" in WEIGHT_FORMATS


@pytest.mark.parametrize("page_size", [0, 8, 48, 255, 256.0, True])
def test_page_size_rule(page_size):
    with pytest.raises(ValueError, match="page_size"):
        check_page_size(page_size)


def test_lora_pairs_rule():
    assert check_lora_pairs([("a", 1), ["b", 0.5]]) == (("a", 1.0), ("b", 0.5)) and check_lora_pairs(()) == ()
    for pairs, message in [([("a", 1.0), ("a", 2.0)], "named twice"), ([("a", float("inf"))], "finite"),
                           ([("a", True)], "finite"), ([("", 1.0)], "non-empty string"), ([(3, 1.0)], "non-empty"),
                           (["a"], "pairs"), ([("a", 1.0, 2)], "pairs")]:
        with pytest.raises(ValueError, match=message):
            check_lora_pairs(pairs)


def test_invalid_setting_names_the_field():
    with pytest.raises(InvalidSetting) as err:
        SamplerSettings(token_presence_penalty=3).validate()
    assert err.value.field == "token_presence_penalty" and str(err.value).startswith("token_presence_penalty=")
    with pytest.raises(InvalidSetting) as err:
        SamplerSettings(token_bias={5: float("inf")}).validate()
    assert err.value.field == "token_bias" and str(err.value).startswith("token_bias[5]=")


def test_stages_and_eos_reasons_cover_what_the_engine_reports():
    assert STAGES == ("deferred", "started", "prefill", "streaming")
    assert set(EOS_REASONS) == {"stop_token", "stop_string", "max_new_tokens", "end_filter", "cancelled",
                                "repetition"}
    assert typing.get_type_hints(StreamingResult)["eos_reason"] is not None
    assert (FREE, CACHED) == (-2, -1)


def test_sampler_settings_validate_once_rule_set():
    s = SamplerSettings(min_p=1.0)
    s.validate()  # min_p = 1 keeps only the most likely tokens: allowed (the app once said [0, 1))
    s.min_p = 1.5
    with pytest.raises(ValueError, match="min_p"):
        s.validate()


def test_generator_metrics_and_results_follow_the_contract(tiny_llama_folder):
    from engine import DynamicGenerator, DynamicJob, Model, PagedCache, Tokenizer

    model, tok = Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=256), tok)
    gen.enqueue(DynamicJob(tok.encode("hello there"), 4, gen_settings=SamplerSettings.greedy()))
    results = []
    while gen.num_remaining_jobs():
        results += gen.iterate()
    assert set(gen.metrics()) == set(METRICS_KEYS)
    assert {r["stage"] for r in results} <= set(STAGES)
    last = results[-1]
    assert last["eos"] and last["eos_reason"] in EOS_REASONS
    allowed = set(typing.get_type_hints(StreamingResult))
    assert set(last) <= allowed, set(last) - allowed

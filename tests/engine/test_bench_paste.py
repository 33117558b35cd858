"""The paste bench's run on the tiny model: what it reports is accounted for (every prompt token in the
chunks it lists, both ratios from its own timings). Numbers, not speed: no assertion here is timed."""
import pytest

from engine.bench.paste import run_once
from tests.engine.test_generator import tiny  # noqa: F401  (the tiny-model fixture)


def test_paste_bench_reports_both_ratios_and_the_schedule(tiny):
    model, tok = tiny
    r = run_once(model, tok, paste=120, others=2, share=1.0, seed=0)
    assert r["ratio"] == pytest.approx(r["decode_tok_s_during"] / r["decode_tok_s_without"])
    assert r["ttft_ratio"] == pytest.approx(r["paste_ttft_s"] / r["solo_ttft_s"])
    assert r["steps"] >= r["prefill_steps"] >= 1 and 1 <= r["median_chunk"] <= r["max_chunk"] <= 121
    assert r["mode"] in ("every step", "saved") and r["decode_ms"] > 0 and r["token_ms"] > 0
    off = run_once(model, tok, paste=120, others=2, share=None, seed=0)  # the fixed token budget: no budget stats
    assert "mode" not in off and off["prefill_steps"] == 1  # all 120 tokens in one step (256 a step)

"""Classifier-free guidance: a (positive, negative) pair runs as two sequences whose log-probs are mixed."""
from __future__ import annotations

import pytest

from engine import DynamicJob, SamplerSettings
from tests.engine.test_generator import make_gen, prompt_ids, run_all, tiny  # noqa: F401  (fixture)


def cfg(scale):
    return SamplerSettings.greedy(cfg_scale=scale)


def test_cfg_scale_one_and_zero_reproduce_each_prompt_alone(tiny):
    pos, neg = prompt_ids(30, 31), prompt_ids(17, 32)
    greedy = SamplerSettings.greedy()
    (alone_pos,), _ = run_all(make_gen(tiny), [DynamicJob(pos, 16, gen_settings=greedy)])
    (alone_neg,), _ = run_all(make_gen(tiny), [DynamicJob(neg, 16, gen_settings=greedy)])
    gen = make_gen(tiny, max_chunk_size=16)
    (one,), _ = run_all(gen, [DynamicJob([pos, neg], 16, gen_settings=cfg(1.0))])
    (zero,), _ = run_all(make_gen(tiny), [DynamicJob([pos, neg], 16, gen_settings=cfg(0.0))])
    assert one == alone_pos
    assert zero == alone_neg
    (mixed,), (fin,) = run_all(make_gen(tiny), [DynamicJob([pos, neg], 16, gen_settings=cfg(3.0))])
    assert mixed != alone_pos
    assert fin["prompt_tokens"] == 30
    assert all(p.ref_count == 0 for p in gen.pagetable.pages)


def test_cfg_runs_beside_plain_jobs(tiny):
    pos, neg = prompt_ids(20, 33), prompt_ids(9, 34)
    plain = prompt_ids(25, 35)
    greedy = SamplerSettings.greedy()
    (want,), _ = run_all(make_gen(tiny), [DynamicJob(plain, 12, gen_settings=greedy)])
    (_, got), _ = run_all(make_gen(tiny), [DynamicJob([pos, neg], 12, gen_settings=cfg(2.0)),
                                           DynamicJob(plain, 12, gen_settings=greedy)])
    assert got == want


def test_cfg_needs_pair_and_scale(tiny):
    with pytest.raises(ValueError, match="CFG"):
        DynamicJob([prompt_ids(4), prompt_ids(5)], 5)
    with pytest.raises(ValueError, match="CFG"):
        DynamicJob(prompt_ids(4), 5, gen_settings=cfg(2.0))
    with pytest.raises(ValueError, match="CFG cannot"):
        DynamicJob([prompt_ids(4), prompt_ids(5)], 5, gen_settings=cfg(2.0), token_healing=True)

"""Sampler tests: every knob moves the distribution the way it should, against hand-computed values and
a plain full-sort reference; plus seeding, greedy exactness, padding, validation and the thread pool.

Most checks read the *final* distribution (top_tokens / top_probs with return_top_tokens = vocab), which
is exact and needs no statistics; a few sample many times where the draw itself is the point.
"""

from __future__ import annotations

import math
import threading
from collections import Counter

import numpy as np
import pytest
import torch

from engine import DynamicJob
from engine.contract import SamplerSettings
from engine.sampling.pool import SamplingPool
from engine.sampling.sampler import JobSampler, SampleResult
from engine.sampling.truncation import _inverse_cdf, _top_k_ids

PLAIN = dict(temperature=1.0, top_k=0, top_p=1.0, token_repetition_penalty=1.0)


def plain(**kw) -> SamplerSettings:
    return SamplerSettings(**{**PLAIN, **kw})


def logits_for(probs, pad_to: int = 32) -> torch.Tensor:
    """Logits whose softmax is `probs`, padded with huge values that must never be chosen."""
    lg = torch.full((pad_to,), 1e4)
    lg[: len(probs)] = torch.log(torch.tensor(probs, dtype=torch.float64)).float()
    return lg


def final_dist(settings, logits, vocab, context=(), seed=0, **kw) -> dict[int, float]:
    """The processed distribution as {token: prob} over tokens with prob > 0."""
    res = JobSampler(settings, seed, vocab, **kw).sample(logits, list(context), return_top_tokens=vocab)
    return {t: p for t, p in zip(res.top_tokens, res.top_probs) if p > 0}


def draws(settings, logits, vocab, n, seed=0, context=(), **kw) -> Counter:
    js = JobSampler(settings, seed, vocab, **kw)
    return Counter(js.sample(logits, list(context)).token for _ in range(n))


P4 = [0.5, 0.3, 0.15, 0.05]


# ---------------------------------------------------------------------------------------------- settings

def test_defaults_follow_exllamav2():
    s = SamplerSettings()
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.typical) == (0.8, 50, 0.8, 0.0, 1.0)
    assert (s.token_repetition_penalty, s.token_repetition_range, s.token_repetition_decay) == (1.025, -1, 0)
    assert (s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_range, s.dry_max_ngram) == (0.0, 1.75, 2, 0, 20)
    assert s.dry_sequence_breakers == ["\n", ":", '"', "*"]
    assert (s.xtc_probability, s.xtc_threshold, s.mirostat_tau, s.mirostat_eta) == (0.0, 0.1, 1.5, 0.1)
    assert s.cfg_scale is None and s.token_bias is None and not s.temperature_last and not s.mirostat
    s.validate()
    # the list default is not shared between instances
    s.dry_sequence_breakers.append("x")
    assert SamplerSettings().dry_sequence_breakers == ["\n", ":", '"', "*"]


def test_greedy_settings():
    g = SamplerSettings.greedy()
    g.validate()
    assert g.is_greedy and g.top_k == 1 and g.temperature == 0.0 and g.token_repetition_penalty == 1.0
    assert SamplerSettings.greedy(token_repetition_penalty=1.3).token_repetition_penalty == 1.3
    assert not SamplerSettings().is_greedy


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", float("inf")), ("temperature", "hot"),
    ("top_k", -1), ("top_k", 2.5), ("top_k", True),
    ("top_p", 0.0), ("top_p", 1.5),
    ("min_p", -0.1), ("min_p", 1.1),
    ("typical", 0.0), ("typical", 1.2),
    ("token_repetition_penalty", 0.0), ("token_repetition_penalty", -1.0),
    ("token_repetition_range", -2), ("token_repetition_decay", -1),
    ("token_frequency_penalty", 3.0), ("token_presence_penalty", -2.5),
    ("token_bias", {-1: 1.0}), ("token_bias", {3: float("nan")}), ("token_bias", {3: float("inf")}),
    ("token_bias", [1.0]),
    ("temperature_last", 1), ("mirostat", "yes"),
    ("skew", float("nan")), ("mirostat_tau", 0.0), ("mirostat_eta", -0.1),
    ("dry_multiplier", -1.0), ("dry_base", 0.5), ("dry_allowed_length", 0), ("dry_range", -1),
    ("dry_max_ngram", 0), ("dry_sequence_breakers", "\n"), ("dry_sequence_breakers", [""]),
    ("xtc_probability", 1.5), ("xtc_probability", -0.1), ("xtc_threshold", 2.0),
    ("cfg_scale", float("nan")),
])
def test_validate_names_the_field(field, value):
    s = SamplerSettings()
    setattr(s, field, value)
    with pytest.raises(ValueError, match=field):
        s.validate()
    with pytest.raises(ValueError, match=field):  # checked once, when the request is made
        DynamicJob(torch.tensor([[1, 2, 3]]), 5, gen_settings=s)


def test_validate_dry_ngram_must_reach_allowed_length():
    s = SamplerSettings(dry_multiplier=1.0, dry_allowed_length=5, dry_max_ngram=3)
    with pytest.raises(ValueError, match="dry_max_ngram"):
        s.validate()


def test_bad_inputs_raise_clearly():
    js = JobSampler(plain(), 0, 40)
    with pytest.raises(ValueError, match="fewer than vocab_size"):
        js.sample(torch.zeros(32), [])
    with pytest.raises(ValueError, match="1-D"):
        js.sample(torch.zeros(2, 64), [])
    with pytest.raises(ValueError, match="NaN"):
        js.sample(torch.full((64,), float("nan")), [])
    with pytest.raises(ValueError, match="masked"):
        js.sample(torch.zeros(64), [], blocked_tokens=range(40))
    with pytest.raises(ValueError, match="return_top_tokens"):
        js.sample(torch.zeros(64), [], return_top_tokens=41)
    with pytest.raises(ValueError, match="token_bias"):
        JobSampler(plain(token_bias={50: 1.0}), 0, 40)
    with pytest.raises(ValueError, match="tokenizer"):
        JobSampler(plain(dry_multiplier=1.0), 0, 40)  # string breakers need a tokenizer to map them
    with pytest.raises(ValueError, match="NaN"):
        JobSampler(SamplerSettings.greedy(), 0, 40).sample(torch.full((64,), float("nan")), [])


# ---------------------------------------------------------------------------------------------- greedy

def test_greedy_is_exact_argmax_with_lowest_id_on_ties():
    lg = torch.tensor([0.0, 3.0, 1.0, 3.0, -2.0] + [0.0] * 27)
    for s in (SamplerSettings.greedy(), plain(temperature=0.0), plain(top_k=1)):
        res = JobSampler(s, None, 5).sample(lg, [])
        assert res.token == 1 and res.prob == 1.0
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        row = torch.randn(49152, generator=gen)
        assert JobSampler(SamplerSettings.greedy(), 0, 49152).sample(row, []).token == int(torch.argmax(row))


def test_greedy_top_tokens_are_next_best_logits():
    lg = torch.tensor([0.0, 3.0, 1.0, 2.5, -2.0] + [9.0] * 27)
    res = JobSampler(SamplerSettings.greedy(), 0, 5).sample(lg, [], return_top_tokens=3)
    assert res.top_tokens == [1, 3, 2] and res.top_probs == [1.0, 0.0, 0.0]


def test_greedy_still_applies_penalties():
    lg = logits_for([0.4, 0.35, 0.25])
    s = SamplerSettings.greedy(token_repetition_penalty=3.0)
    assert JobSampler(s, 0, 3).sample(lg, [0]).token == 1


# ---------------------------------------------------------------------------------------------- padding, seeds

def test_padded_logits_are_never_sampled():
    lg = torch.full((64,), 50.0)
    lg[:5] = torch.tensor([1.0, 0.5, 0.2, 0.1, 0.0])
    for s in (plain(), SamplerSettings(), SamplerSettings.greedy(), plain(top_k=10), plain(skew=3.0)):
        c = draws(s, lg, 5, 200)
        assert set(c) <= set(range(5)), (s, c)


def test_same_seed_same_tokens_and_independent_of_other_jobs():
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randn(1024, generator=gen) for _ in range(30)]
    s = plain(temperature=1.3)

    def run(seed, interleave=False):
        js, other = JobSampler(s, seed, 1000), JobSampler(s, seed + 1, 1000)
        out = []
        for r in rows:
            if interleave:
                other.sample(r, [])
            out.append(js.sample(r, []).token)
        return out

    a = run(7)
    assert a == run(7) == run(7, interleave=True)
    assert a != run(8)
    assert JobSampler(s, None, 1000).seed != JobSampler(s, None, 1000).seed  # None draws a fresh seed


def test_caller_logits_are_not_modified():
    lg = logits_for(P4)
    before = lg.clone()
    s = SamplerSettings(token_bias={0: -5.0}, token_repetition_penalty=2.0, dry_multiplier=1.0,
                        dry_sequence_breakers=[])
    JobSampler(s, 0, 4).sample(lg, [0, 1, 0, 1, 0], blocked_tokens=[2])
    assert torch.equal(lg, before)


# ---------------------------------------------------------------------------------------------- the draw

def test_plain_sampling_matches_softmax():
    probs = [0.4, 0.3, 0.2, 0.1]
    n = 4000
    c = draws(plain(), logits_for(probs), 4, n, seed=1)
    for t, p in enumerate(probs):
        assert abs(c[t] / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    res = JobSampler(plain(), 0, 4).sample(logits_for(probs), [])
    assert res.prob == pytest.approx(probs[res.token], rel=1e-5)


def test_long_row_draw_uses_exact_cdf():
    """The two-level inverse CDF over a full vocabulary equals a plain cumsum search."""
    rng = np.random.default_rng(0)
    p = rng.random(49152) ** 8
    p /= p.sum()
    cum = np.cumsum(p)
    for r in rng.random(300):
        want = min(int(np.searchsorted(cum, r * cum[-1], side="right")), p.shape[0] - 1)
        assert abs(_inverse_cdf(p.astype(np.float32), float(r)) - want) <= 1  # float32 rounding only


def test_top_k_prefilter_is_exact():
    rng = np.random.default_rng(1)
    for scale in (0.1, 1.0, 4.0, 30.0):
        for k in (1, 5, 50, 400):
            x = (rng.standard_normal(5000) * scale).astype(np.float32)
            assert set(_top_k_ids(x, k).tolist()) == set(np.argsort(-x, kind="stable")[:k].tolist())


# ---------------------------------------------------------------------------------------------- truncation

def test_temperature_flattens_and_sharpens():
    lg = logits_for(P4)
    for t in (0.5, 2.0):
        d = final_dist(plain(temperature=t), lg, 4)
        want = np.array(P4) ** (1 / t)
        want /= want.sum()
        assert [d[i] for i in range(4)] == pytest.approx(want.tolist(), rel=1e-5)


def test_top_k_keeps_k_best():
    d = final_dist(plain(top_k=2), logits_for(P4), 4)
    assert d == pytest.approx({0: 0.5 / 0.8, 1: 0.3 / 0.8})
    assert set(draws(plain(top_k=2), logits_for(P4), 4, 300)) == {0, 1}


def test_top_p_keeps_smallest_nucleus():
    assert set(final_dist(plain(top_p=0.79), logits_for(P4), 4)) == {0, 1}
    assert set(final_dist(plain(top_p=0.81), logits_for(P4), 4)) == {0, 1, 2}
    assert set(final_dist(plain(top_p=0.3), logits_for(P4), 4)) == {0}


def test_min_p_keeps_tokens_near_the_top():
    assert set(final_dist(plain(min_p=0.2), logits_for(P4), 4)) == {0, 1, 2}
    assert set(final_dist(plain(min_p=0.5), logits_for(P4), 4)) == {0, 1}


def test_typical_can_drop_the_most_probable_token():
    # entropy 1.505 nats: the 0.15 tokens (surprise 1.90) are more typical than the 0.4 one (0.92)
    probs = [0.4, 0.15, 0.15, 0.15, 0.15]
    d = final_dist(plain(typical=0.5), logits_for(probs), 5)
    assert set(d) == {1, 2, 3, 4} and d[1] == pytest.approx(0.25)
    assert 0 not in draws(plain(typical=0.5), logits_for(probs), 5, 300)


def test_temperature_last_changes_what_min_p_keeps():
    probs = [0.7, 0.2, 0.1]  # T=3 first: [.46, .30, .24] -> min_p 0.25 keeps all; last: keeps {0, 1}
    first = final_dist(plain(temperature=3.0, min_p=0.25), logits_for(probs), 3)
    last = final_dist(plain(temperature=3.0, min_p=0.25, temperature_last=True), logits_for(probs), 3)
    assert set(first) == {0, 1, 2}
    assert set(last) == {0, 1}
    w = np.array([0.7, 0.2]) ** (1 / 3)
    assert [last[0], last[1]] == pytest.approx((w / w.sum()).tolist())


def reference_dist(logits, s: SamplerSettings) -> dict[int, float]:
    """Straightforward full-sort version of the truncation chain, for comparison."""
    x = logits.astype(np.float64)
    t1 = 1.0 if s.temperature_last else s.temperature
    p = np.exp((x - x.max()) / t1)
    p /= p.sum()
    ids = np.argsort(-p, kind="stable")
    p = p[ids]
    if s.top_k:
        ids, p = ids[: s.top_k], p[: s.top_k] / p[: s.top_k].sum()
    if s.top_p < 1:
        n = min(int(np.searchsorted(np.cumsum(p), s.top_p)) + 1, len(p))
        ids, p = ids[:n], p[:n] / p[:n].sum()
    if s.min_p > 0:
        keep = p >= s.min_p * p.max()
        ids, p = ids[keep], p[keep] / p[keep].sum()
    if s.typical < 1:
        dev = np.abs(-np.log(p) + np.sum(p * np.log(p)))
        order = np.argsort(dev, kind="stable")
        n = min(int(np.searchsorted(np.cumsum(p[order]), s.typical)) + 1, len(p))
        keep = np.sort(order[:n])
        ids, p = ids[keep], p[keep] / p[keep].sum()
    if s.temperature_last:
        p = p ** (1 / s.temperature)
        p /= p.sum()
    return dict(zip(ids.tolist(), p.tolist()))


@pytest.mark.parametrize("case", range(24))
def test_truncation_chain_matches_reference(case):
    rng = np.random.default_rng(case)
    vocab = 3000
    x = (rng.standard_normal(vocab) * rng.choice([0.5, 2.0, 5.0])).astype(np.float32)
    s = plain(temperature=float(rng.choice([0.7, 1.0, 1.6])), top_k=int(rng.choice([0, 20, 500])),
              top_p=float(rng.choice([1.0, 0.5, 0.9, 0.97])), min_p=float(rng.choice([0.0, 0.02, 0.2])),
              typical=float(rng.choice([1.0, 0.6, 0.95])), temperature_last=bool(rng.random() < 0.5))
    got = JobSampler(s, 0, vocab).sample(torch.from_numpy(x), [], return_top_tokens=vocab)
    got_d = {t: p for t, p in zip(got.top_tokens, got.top_probs) if p > 0}
    want = reference_dist(x, s)
    assert set(got_d) == set(want)
    for t, p in want.items():
        assert got_d[t] == pytest.approx(p, rel=1e-4, abs=1e-7)


# ---------------------------------------------------------------------------------------------- XTC

def test_xtc_removes_top_choices_above_threshold():
    s = plain(xtc_probability=1.0, xtc_threshold=0.1)
    d = final_dist(s, logits_for(P4), 4)
    assert set(d) == {2, 3} and d[2] == pytest.approx(0.75)  # 0.5 and 0.3 removed, 0.15 is the least above
    assert set(draws(s, logits_for(P4), 4, 200)) == {2, 3}
    assert set(final_dist(plain(xtc_probability=0.0), logits_for(P4), 4)) == {0, 1, 2, 3}
    # only one token above the threshold: nothing to exclude
    assert set(final_dist(plain(xtc_probability=1.0, xtc_threshold=0.4), logits_for(P4), 4)) == {0, 1, 2, 3}


def test_xtc_triggers_with_its_probability_and_spares_stop_tokens():
    c = draws(plain(xtc_probability=0.5, xtc_threshold=0.05), logits_for([0.9, 0.1]), 2, 2000)
    assert 0.4 < c[0] / 2000 < 0.5  # top token only when XTC did not trigger (p 0.5 * 0.9 = 0.45)
    d = final_dist(plain(xtc_probability=1.0), logits_for(P4), 4, stop_token_ids=[0])
    assert set(d) == {0, 2, 3}  # the stop token survives, the 0.3 token does not


# ---------------------------------------------------------------------------------------------- mirostat

def test_mirostat_truncates_by_surprise_and_adapts_mu():
    probs = [0.5, 0.3, 0.15, 0.05]
    js = JobSampler(plain(mirostat=True, mirostat_tau=1.5, mirostat_eta=0.1), 0, 4)
    assert js.mirostat_mu is None
    res = js.sample(logits_for(probs), [], return_top_tokens=4)
    # mu starts at 2 * tau = 3: tokens with surprise > 3 bits (p < 0.125) are cut
    kept = {t for t, p in zip(res.top_tokens, res.top_probs) if p > 0}
    assert kept == {0, 1, 2}
    assert js.mirostat_mu == pytest.approx(3.0 + 0.1 * (1.5 + math.log2(res.prob)))
    # a low mu (< 1 bit) leaves only the top token; each safe pick (surprise 0) raises mu by eta * tau
    js.mirostat_mu = 0.5
    for _ in range(3):
        assert js.sample(logits_for(probs), []).token == 0
    assert js.mirostat_mu == pytest.approx(0.5 + 3 * 0.1 * 1.5)


def test_mirostat_steers_surprise_toward_tau():
    probs = np.exp(-np.arange(200) / 20.0)
    probs /= probs.sum()
    lg = logits_for(probs.tolist(), pad_to=224)
    for tau in (2.0, 5.0):
        js = JobSampler(plain(mirostat=True, mirostat_tau=tau, mirostat_eta=0.2), 3, 200)
        surprise = [-math.log2(js.sample(lg, []).prob) for _ in range(600)]
        assert abs(np.mean(surprise[100:]) - tau) < 0.5


# ---------------------------------------------------------------------------------------------- skew

def test_skew_shifts_toward_less_likely_tokens():
    lg = logits_for(P4)
    n = 2000
    base = draws(plain(), lg, 4, n, seed=5)
    pos = draws(plain(skew=1.5), lg, 4, n, seed=5)
    neg = draws(plain(skew=-1.5), lg, 4, n, seed=5)
    assert pos[0] < base[0] < neg[0]
    assert pos[3] > base[3] > neg[3]
    # exact rule: r' = r ** exp(-skew) on the descending CDF; the top token needs r' < 0.5
    assert abs(pos[0] / n - 0.5 ** math.exp(1.5)) < 0.03


# ---------------------------------------------------------------------------------------------- top tokens

def test_top_tokens_are_the_final_distribution_padded_with_zero():
    res = JobSampler(plain(top_k=2), 0, 4).sample(logits_for(P4), [], return_top_tokens=3)
    assert isinstance(res, SampleResult)
    assert res.top_tokens == [0, 1, 2]
    assert res.top_probs == pytest.approx([0.625, 0.375, 0.0])
    assert res.prob == pytest.approx(res.top_probs[res.top_tokens.index(res.token)])


# ---------------------------------------------------------------------------------------------- pool

def test_pool_runs_inline_below_min_threads():
    pool = SamplingPool(max_threads=4, min_threads=3)
    assert pool.run([]) == [] and pool.busy_last == 0
    me = threading.get_ident()
    assert pool.run([threading.get_ident, threading.get_ident]) == [me, me]
    assert pool.busy_last == 1
    pool.shutdown()


def test_pool_uses_several_threads_and_keeps_order():
    pool = SamplingPool(max_threads=4, min_threads=3)
    barrier = threading.Barrier(3, timeout=10)  # three tasks can only pass together on three threads

    def task(i):
        barrier.wait()
        return i, threading.get_ident()

    out = pool.run([lambda i=i: task(i) for i in range(3)])
    assert [i for i, _ in out] == [0, 1, 2]
    assert len({t for _, t in out}) == 3 and pool.busy_last == 3 and pool.max_threads == 4
    assert threading.get_ident() not in {t for _, t in out}
    assert pool.run([lambda i=i: i * i for i in range(50)]) == [i * i for i in range(50)]
    assert 1 <= pool.busy_last <= 4
    pool.shutdown()


def test_pool_waits_for_all_then_raises_first_error():
    done = []

    def ok(i):
        done.append(i)
        return i

    def bad():
        raise RuntimeError("boom")

    with SamplingPool(max_threads=2, min_threads=1) as pool:
        with pytest.raises(RuntimeError, match="boom"):
            pool.run([lambda: ok(0), bad, lambda: ok(2), lambda: ok(3)])
        assert sorted(done) == [0, 2, 3]
    with pytest.raises(ValueError, match="max_threads"):
        SamplingPool(max_threads=0)


def test_pool_samples_jobs_like_inline():
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 512, generator=gen)
    s = plain(top_k=40, top_p=0.9)

    def step(pool):
        samplers = [JobSampler(s, i, 500) for i in range(6)]
        return [pool.run([lambda js=js, r=rows[i]: js.sample(r, []).token for i, js in enumerate(samplers)])
                for _ in range(5)]

    with SamplingPool(max_threads=1) as inline, SamplingPool(max_threads=4, min_threads=2) as threaded:
        assert step(inline) == step(threaded)

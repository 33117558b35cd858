"""The prefill budget in time (engine.step_budget): its arithmetic on given step times, and the generator
obeying it step by step (whatever this machine's timings are; no test here depends on them)."""
import pytest
import torch

from engine import DynamicGenerator, DynamicJob, PagedCache, SamplerSettings
from engine.generator.step_budget import StepBudget
from tests.engine.test_generator import tiny  # noqa: F401  (the tiny-model fixture)

GREEDY = SamplerSettings.greedy()


def test_budget_pays_prefill_from_the_decoders_credit():
    b = StepBudget(max_tokens=256, slowdown=1.5, min_tokens=8, first_tokens=16, save_steps=4)
    assert b.tokens(0) == 256  # nobody decodes: throughput only
    assert b.tokens(3) == 16  # nothing measured yet: a small first chunk
    b.record(0, 3, 0.010)  # a decode-only step: 10 ms
    b.record(16, 3, 0.030)  # 16 prefill tokens beside the decoders added 20 ms: 1.25 ms a token
    assert b.decode_s == pytest.approx(0.010) and b.token_s == pytest.approx(0.020 / 16)
    assert b.credit == pytest.approx(0.005 - 0.020)  # earned half a decode step, spent 20 ms: an overrun
    assert b.tokens(3) == 0  # repaid first
    for _ in range(3):
        b.record(0, 3, 0.010)
    assert b.credit == pytest.approx(0.0) and b.tokens(3) == 0
    b.record(0, 3, 0.010)
    assert b.tokens(3) == 0  # 5 ms buys 4 tokens: below min_tokens, saved for a chunk worth its fixed cost
    b.record(0, 3, 0.010)
    assert b.tokens(3) == 8
    for _ in range(20):
        b.record(0, 3, 0.010)
    assert b.credit == pytest.approx(4 * 0.005)  # saving is capped at save_steps steps' credit
    assert b.tokens(3) == 16
    b.token_s = 1.0
    assert b.tokens(3) == 1  # saved all it may, can't afford min_tokens: still progress
    b.token_s = 1e-9
    assert b.tokens(3) == 256  # never above the token budget


def test_others_keep_their_share_whatever_a_prefill_step_costs():
    """A simulated machine where a step with any prefill pays a fixed cost (leaving the fused decode call) plus
    a cost per token: over a 2000-token paste the decoders keep ~1/slowdown of their rate, and the paste
    still goes in."""
    for fixed, per_token in ((0.008, 0.002), (0.030, 0.0005), (0.001, 0.010)):
        b = StepBudget(max_tokens=2048, slowdown=1.6)
        decode, left, steps, elapsed = 0.010, 2000, 0, 0.0
        b.record(0, 3, decode)
        while left > 0:
            n = min(left, b.tokens(3))
            seconds = decode + (fixed + n * per_token if n else 0.0)
            b.record(n, 3, seconds)
            left, steps, elapsed = left - n, steps + 1, elapsed + seconds
            assert steps < 10_000
        kept = steps * decode / elapsed
        assert kept >= 0.9 / 1.6, (fixed, per_token, kept)


@pytest.mark.parametrize("kwargs", [dict(max_tokens=0), dict(max_tokens=8, slowdown=1.0), dict(max_tokens=8, min_tokens=0),
                                    dict(max_tokens=8, save_steps=0)])
def test_bad_budgets_are_refused(kwargs):
    with pytest.raises(ValueError):
        StepBudget(**kwargs)


def test_generator_prefills_within_the_budget_while_others_decode(tiny):
    model, tok = tiny
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), tok, max_chunk_size=64)
    gen.step_budget.min_tokens = 1  # spend credit as it comes: the loop below must end long before the chat
    chat = DynamicJob(torch.randint(10, 400, (1, 8)), 480, gen_settings=GREEDY)  # decodes all along
    gen.enqueue(chat)
    while chat in gen.pending or chat.prefilling:
        gen.iterate()
    paste = DynamicJob(torch.randint(10, 400, (1, 300)), 2, gen_settings=GREEDY)
    gen.enqueue(paste)
    chunks = []
    while paste in gen.pending or (paste in gen.active and paste.prefilling):
        allowed = gen.step_budget.tokens(1)  # the chat decodes in every one of these steps
        gen.iterate()
        m = gen.metrics()
        assert m["decode_tokens_step"] >= 1  # the chat decoded in this step
        assert m["prefill_tokens_step"] <= allowed
        chunks.append(m["prefill_tokens_step"])
    assert sum(chunks) >= 299  # the whole prompt went in (its last token rides with the first sample)
    assert chunks[0] == gen.step_budget.first_tokens or gen.step_budget.token_s is not None

    old = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), tok, max_chunk_size=64,
                           prefill_slowdown=None)
    assert old.step_budget is None
    old.enqueue([DynamicJob(torch.randint(10, 400, (1, 8)), 40, gen_settings=GREEDY)])
    old.iterate()
    old.enqueue(DynamicJob(torch.randint(10, 400, (1, 300)), 2, gen_settings=GREEDY))
    old.iterate()
    old.iterate()
    assert old.metrics()["prefill_tokens_step"] == 64  # the fixed token budget, whatever it costs

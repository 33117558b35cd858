"""The prefill budget in time (engine.step_budget): its arithmetic on given step times, and the generator
obeying it step by step (whatever this machine's timings are; no test here depends on them)."""
import pytest
import torch

from engine import DynamicGenerator, DynamicJob, PagedCache, SamplerSettings
from engine.generator.step_budget import StepBudget
from tests.engine.test_generator import tiny  # noqa: F401  (the tiny-model fixture)

GREEDY = SamplerSettings.greedy()


def test_budget_follows_the_measured_costs():
    b = StepBudget(max_tokens=256, slowdown=1.5, first_tokens=16)
    assert b.tokens(0) == 256  # nobody decodes: throughput only
    assert b.tokens(3) == 16  # nothing measured yet: a small first chunk
    b.record(0, 3, 0.010)  # a decode-only step: 10 ms
    b.record(10, 3, 0.030)  # 10 prefill tokens beside the decoders added 20 ms: 2 ms a token
    assert b.decode_s == pytest.approx(0.010) and b.token_s == pytest.approx(0.002)
    assert b.tokens(3) == 2  # 0.5 x 10 ms of spare time / 2 ms
    b.record(0, 3, 0.050)  # slower decode steps (a longer context) leave room for more
    assert b.decode_s == pytest.approx(0.010 + 0.25 * 0.040)
    assert b.tokens(3) == int(0.5 * b.decode_s / b.token_s)
    b.record(256, 0, 0.256)  # a prefill-only step: the whole step is prefill
    assert b.token_s == pytest.approx(0.002 + 0.25 * (0.001 - 0.002))
    b.token_s = 1e-9
    assert b.tokens(1) == 256  # never above the token budget
    b.token_s = 10.0
    assert b.tokens(1) == 1  # and always some progress


@pytest.mark.parametrize("kwargs", [dict(max_tokens=0), dict(max_tokens=8, slowdown=1.0), dict(max_tokens=8, min_tokens=0)])
def test_bad_budgets_are_refused(kwargs):
    with pytest.raises(ValueError):
        StepBudget(**kwargs)


def test_generator_prefills_within_the_budget_while_others_decode(tiny):
    model, tok = tiny
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), tok, max_chunk_size=64)
    chat = DynamicJob(torch.randint(10, 400, (1, 8)), 40, gen_settings=GREEDY)
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

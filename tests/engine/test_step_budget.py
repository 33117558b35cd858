"""The prefill budget (engine.step_budget): a fair share in solo time. Its arithmetic on given step costs, the
two goals over a simulated paste (the decoders keep >= 1/2 of their rate, the paste's first token within 2x
of its solo prefill) wherever the costs make them possible, and the generator scheduling chunks by it. No
test here depends on this machine's timings: step times are given."""
import pytest
import torch

from engine import DynamicGenerator, DynamicJob, PagedCache, SamplerSettings
from engine.generator.step_budget import EVERY, SAVE, StepBudget
from tests.engine.test_generator import tiny  # noqa: F401  (the tiny-model fixture)

GREEDY = SamplerSettings.greedy()
D, P = 0.020, 0.002  # a decode-only step, a prompt token prefilled alone


def measured(budget: StepBudget, decode=D, token=P) -> StepBudget:
    budget.record(256, 0, 256 * token)  # a prompt prefilled alone
    budget.record(0, 3, decode)  # a decode-only step
    return budget


def paste(budget: StepBudget, n: int, mixed, decode=D, token=P):
    """Prefill an n-token paste beside 3 decoders; mixed(c): a step's seconds with a c-token chunk. Returns
    (kept, r, chunks): the decoders' share of their rate, TTFT / solo prefill, each step's chunk."""
    left, steps, elapsed, chunks = n, 0, 0.0, []
    while left > 0:
        c = min(left, budget.tokens(3, left))
        seconds = mixed(c) if c else decode
        budget.record(c, 3, seconds)
        left, steps, elapsed = left - c, steps + 1, elapsed + seconds
        chunks.append(c)
        assert steps < 100_000
    return steps * decode / elapsed, elapsed / (n * token), chunks


def test_a_decode_step_earns_what_a_solo_prefill_does_in_its_time():
    b = StepBudget(max_tokens=2048, min_tokens=8, first_tokens=16)
    assert b.tokens(0) == 2048  # nobody decodes: throughput only
    assert b.tokens(3) == 16  # nothing measured yet: a small first chunk
    measured(b)
    assert b.earned() == pytest.approx(D / P)  # 10 tokens a decode step
    assert b.tokens(3) == 10  # the step about to run earns its own share
    b.record(10, 3, 0.5 * D + 10 * P)  # the chunk's solo cost + o = D/2 (the decoders' rows ride along)
    assert b.overhead_s[EVERY] == pytest.approx(0.5 * D) and b.mode == EVERY and b.credit == pytest.approx(0)
    assert b.predicted_ratio() == pytest.approx(1.5)
    assert StepBudget(2048, share=2.0).tokens(3) == 16 and measured(StepBudget(2048, share=2.0)).tokens(3) == 20
    slow = measured(StepBudget(2048, min_tokens=8), token=0.004)  # 5 tokens a decode step: below min_tokens
    assert slow.tokens(3) == 0  # saved for a chunk the GEMM path takes
    slow.record(0, 3, D)
    assert slow.tokens(3) == 10


def test_with_a_shared_weight_pass_both_goals_hold():
    """o < D (the decoders' rows ride in the chunk's pass): a chunk of D/p every step, kept = 1/r > 1/2."""
    for o in (0.2 * D, 0.6 * D, 0.95 * D):
        b = measured(StepBudget(2048))
        kept, r, chunks = paste(b, 2000, lambda c: o + c * P)
        assert b.mode == EVERY and set(chunks[1:-1]) == {10}  # every step, D/p tokens
        assert kept >= 0.5 and r <= 2.0, (o, kept, r)
        assert kept * r == pytest.approx(1.0, rel=0.02)  # neither side pays more than the other


def test_without_sharing_chunks_grow_until_the_overhead_is_amortized():
    """o > D (a mixed step pays the decoders' full step and a fixed cost on top): the goals can't both hold
    (T >= S*D + N*p); the budget saves credit into chunks big enough that r <= 2 (1 + tolerance), kept = 1/r."""
    for fixed in (0.2 * D, 1.0 * D, 3.0 * D):
        b = measured(StepBudget(2048, tolerance=0.05))
        kept, r, chunks = paste(b, 2000, lambda c: D + fixed + c * P)
        assert b.mode == SAVE
        steady = chunks[len(chunks) // 2 : -5]
        assert max(steady) > 10 and steady.count(0) > 0  # decode-only steps save for bigger chunks
        assert r <= 2.0 * 1.05 + 0.05 and kept >= 1 / (2.0 * 1.05 + 0.05), (fixed, kept, r)
        assert kept * r == pytest.approx(1.0, rel=0.05)


def test_the_paste_never_gets_more_than_its_share():
    b = measured(StepBudget(2048))
    steps = given = 0
    for _ in range(500):
        c = b.tokens(3)
        b.record(c, 3, D + 0.3 * D + c * P if c else D)
        steps, given = steps + 1, given + c
        assert given * P <= steps * D + b.target() * P + 1e-9  # solo-time fairness, up to one chunk


def test_credit_saved_in_a_quiet_stretch_buys_one_chunk_not_a_stall():
    b = measured(StepBudget(2048))
    b.overhead_s[SAVE] = b.overhead_s[EVERY] = 2.0 * D
    b.mode = SAVE
    for _ in range(10_000):  # decoders alone for a long while
        b.record(0, 3, D)
    assert b.tokens(3) <= b.target() + b.earned()
    b.overhead_s[SAVE] = 1e3  # one absurd step (a machine stalled for seconds)
    assert b.target() == 32 * b.earned()  # max_save_steps decode steps' share, not the whole token budget


def test_one_stalled_decode_step_does_not_buy_a_huge_chunk():
    b = measured(StepBudget(2048))
    for _ in range(4):
        b.record(0, 3, D)
    b.record(0, 3, 90 * D)  # the machine stalled for a moment (a 1.8 s step bought a 1705-token chunk)
    assert b.decode_s == pytest.approx(D) and b.earned() == pytest.approx(D / P)


@pytest.mark.parametrize("kwargs", [dict(max_tokens=0), dict(max_tokens=8, share=0), dict(max_tokens=8, min_tokens=0),
                                    dict(max_tokens=8, tolerance=0), dict(max_tokens=8, max_save_steps=0)])
def test_bad_budgets_are_refused(kwargs):
    with pytest.raises(ValueError):
        StepBudget(**kwargs)


class GivenCosts(StepBudget):
    """The generator's budget fed modelled step times instead of this machine's (the schedule is then the same
    on every machine): decode-only D, a c-token chunk alone c*P, beside decoders o + c*P."""

    def __init__(self, max_tokens: int, o: float):
        super().__init__(max_tokens)
        self.o = o

    def record(self, prefill_tokens: int, decoding: int, seconds: float) -> None:
        seconds = prefill_tokens * P + ((self.o if prefill_tokens else D) if decoding else 0.0)
        super().record(prefill_tokens, decoding, seconds)


@pytest.mark.parametrize("o", [0.5 * D, 2.0 * D])
def test_generator_interleaves_chunks_with_every_decode_step(tiny, o):
    model, tok = tiny
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), tok, max_chunk_size=512)
    gen.step_budget = budget = GivenCosts(512, o)
    chats = [DynamicJob(torch.randint(10, 400, (1, 8)), 200, gen_settings=GREEDY) for _ in range(2)]
    gen.enqueue(chats)
    while any(c in gen.pending or c.prefilling for c in chats):
        gen.iterate()
    gen.iterate()  # a decode-only step: D measured
    paste_job = DynamicJob(torch.randint(10, 400, (1, 300)), 2, gen_settings=GREEDY)
    gen.enqueue(paste_job)
    chunks = []
    while paste_job in gen.pending or (paste_job in gen.active and paste_job.prefilling):
        allowed = budget.tokens(2, 299 - (paste_job.seq.kv_len if paste_job in gen.active else 0))
        gen.iterate()
        m = gen.metrics()
        assert m["decode_tokens_step"] == 2  # both chats decode in every step of the paste
        assert m["prefill_tokens_step"] <= allowed
        chunks.append(m["prefill_tokens_step"])
    assert sum(chunks) >= 299  # the whole prompt went in (its last token rides with the first sample)
    assert budget.earned() == pytest.approx(D / P)  # the solo rate: the chats' 8-token prompts went in alone
    if o < D:  # shared pass: a chunk every step, D/p tokens (less where a chunk ends on a page boundary)
        assert budget.mode == EVERY and all(0 < c < 20 for c in chunks[:-1]), chunks  # a shortfall is carried
        assert sum(chunks[:-1]) / len(chunks[:-1]) == pytest.approx(10, abs=1), chunks  # D/p tokens a step
    else:  # decode-only steps save for chunks big enough to amortize o
        assert budget.mode == SAVE and chunks.count(0) > len(chunks) // 2 and max(chunks) >= 5 * 10, chunks
    elapsed = sum(budget.o + c * P if c else D for c in chunks)
    kept, r = len(chunks) * D / elapsed, elapsed / (300 * P)
    assert kept * r == pytest.approx(1.0, rel=0.15)  # the same slowdown for both sides

    old = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), tok, max_chunk_size=64,
                           prefill_share=None)
    assert old.step_budget is None
    old.enqueue([DynamicJob(torch.randint(10, 400, (1, 8)), 40, gen_settings=GREEDY)])
    old.iterate()
    old.enqueue(DynamicJob(torch.randint(10, 400, (1, 300)), 2, gen_settings=GREEDY))
    old.iterate()
    old.iterate()
    assert old.metrics()["prefill_tokens_step"] == 64  # the fixed token budget, whatever it costs


def small_chunk_step(c):
    """A mixed step whose chunk is under the kernels' efficient path (16 rows) pays 0.9 D extra; the decoders'
    rows otherwise ride in the chunk's pass (0.3 D)."""
    return 0.3 * D + c * P + (0.9 * D if c < 16 else 0.0)


@pytest.mark.parametrize("spread", [1.5, float("inf")])
def test_small_chunks_costing_more_per_token_are_outgrown(spread):
    """o = t - c*p measured on D/p-token chunks (1.2 D) overstates what a bigger chunk costs beyond its tokens;
    the cost line over the sizes seen picks chunks that clear both goals. spread = inf: no line (the old
    budget, o per mode), which misses them."""
    b = measured(StepBudget(2048, spread=spread))
    kept, r, chunks = paste(b, 4000, small_chunk_step)
    if spread == float("inf"):
        assert b.steps_fitted is None and not (kept >= 0.5 and r <= 2.0), (kept, r)
    else:
        assert b.steps_fitted is not None, b.cost_line()
        assert kept >= 0.5 and r <= 2.0, (kept, r, b.steps_fitted)


def test_the_fitted_schedule_counts_the_decoders_share():
    """Where a mixed step costs a full decode step plus a fixed cost (A > D), the line says save: a chunk every
    step would hold the decoders far under half their rate. Fails if the cycle's decode steps were ignored."""
    b = measured(StepBudget(2048))
    kept, r, chunks = paste(b, 4000, lambda c: 2.0 * D + c * P)
    assert b.steps_fitted is not None and b.steps_fitted > 1 and b.mode == SAVE
    every_kept, _ = b.fitted_schedule(1)
    assert every_kept < 0.4  # spending every step: D / (2D + D)
    assert kept >= 1 / (2.0 * 1.05 + 0.05) and r <= 2.0 * 1.05 + 0.05, (kept, r)
    assert b.fitted_schedule(b.steps_fitted)[0] == pytest.approx(kept, rel=0.1)  # the line predicts the run


def test_the_cost_line_is_least_squares_and_needs_a_spread():
    b = measured(StepBudget(2048))
    for c in (10, 10, 10, 11):
        b._mixed.append((c, 0.01 + 0.002 * c))
    assert b.cost_line() is None  # one size: fixed and per-token cost can't be told apart
    b._mixed.extend([(40, 0.01 + 0.08), (80, 0.01 + 0.16)])
    a, slope = b.cost_line()
    assert a == pytest.approx(0.01) and slope == pytest.approx(0.002)


def test_prompts_queued_together_are_prefilled_at_full_speed_first_come_first_served(tiny):
    """Four chats sent at once: the first to get its token does not shield itself from the three prompts queued
    beside it (they would go in at a fair share while it decodes, and the four decode in staggered batches);
    a prompt queued after a chat started decoding is shared with it."""
    model, tok = tiny
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=2048, page_size=16), tok, max_chunk_size=64)
    gen.step_budget = GivenCosts(64, 0.5 * D)
    gen.step_budget.record(64, 0, 64 * P)  # measured: a solo prefill and a decode-only step
    gen.step_budget.record(0, 2, D)
    chats = [DynamicJob(torch.randint(10, 400, (1, 65)), 20, gen_settings=GREEDY) for _ in range(4)]
    gen.enqueue(chats)
    chunks = []
    while any(c in gen.pending or c.prefilling for c in chats):
        gen.iterate()
        chunks.append(gen.metrics()["prefill_tokens_step"])
    assert chunks == [65] * 4, chunks  # one whole prompt a step (its last token rides along, sampled)
    paste_job = DynamicJob(torch.randint(10, 400, (1, 300)), 2, gen_settings=GREEDY)
    gen.enqueue(paste_job)
    gen.iterate()
    gen.iterate()
    assert 0 < gen.metrics()["prefill_tokens_step"] < 64  # a paste after they stream: its fair share


ONE_PASS = lambda c: 0.7 * D + c * P  # noqa: E731  decode rows in the chunk's GEMM: A = 0.7 D
TWO_PASS = lambda c: 1.3 * D + 1.1 * c * P  # noqa: E731  a second pass for the decode rows: A = 1.3 D, B = 1.1 p


@pytest.mark.parametrize("passes", [1, 2])
def test_the_decoders_keep_their_bound_and_the_paste_its_steps(passes):
    """A simulated 2000-token paste beside 3 decoders. One weight pass (A < D): both goals, a chunk of one
    decode step's share every step. Two passes (A > D (2 - B/p)): the explained model says unreachable, and
    the schedule sits on the frontier kept = 1/r, within the tolerance of 1/2 on both sides, never starving
    the decoders. Either way the paste takes about N*p/D steps (one per decode step's share), no more."""
    n = 2000
    b = measured(StepBudget(2048))
    kept, r, chunks = paste(b, n, ONE_PASS if passes == 1 else TWO_PASS)
    why = b.explain()
    assert len(chunks) <= 1.05 * n * P / D + b.max_save_steps, len(chunks)
    if passes == 1:
        assert why["reachable"] and why["a_over_d"] == pytest.approx(0.7, rel=0.05), why
        assert b.mode == EVERY and (b.steps_fitted or 1) == 1 and kept >= 0.5 and r <= 2.0, (kept, r, why)
    else:
        assert not why["reachable"] and why["a_over_d"] == pytest.approx(1.3, rel=0.05), why
        assert kept >= 0.5 / 1.08 and r <= 2.0 * 1.08, (kept, r, why)
        assert kept * r == pytest.approx(1.0, rel=0.05)
        assert max(chunks) * P + 1.3 * D <= 1.1 * (b.max_save_steps + 2) * D * 1.1  # a chunk's pause is bounded
    assert why["predicted_kept"] == pytest.approx(kept, rel=0.1), why  # the explained model predicts the run


def test_big_chunks_cheaper_than_the_reference_make_saving_reach_both_goals():
    """The 8B-shaped model's measured line (A = 1.28 D, B = 0.88 p): one decode step's share every step keeps
    the decoders under half (1 / 2.16), but saving for k >= 3 reaches both goals; explain() says so."""
    b = measured(StepBudget(2048))
    kept, r, _ = paste(b, 4000, lambda c: 1.28 * D + 0.88 * c * P)
    why = b.explain()
    assert why["reachable"] and b.steps_fitted is not None and b.steps_fitted >= 3, why
    assert b.fitted_schedule(1)[0] < 0.5
    assert kept >= 0.5 and r <= 2.0, (kept, r, why)

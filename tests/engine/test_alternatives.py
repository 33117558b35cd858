"""N alternatives of one prompt: the prompt is prefilled once and its pages shared, the N replies decode in
the same steps, greedy alternatives equal the solo run and seeded ones differ."""
from __future__ import annotations

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from tests.engine.pagetable_checks import check_released, check_table, live_sequences


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder):
    return Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)


def make_gen(tiny):
    model, tok = tiny
    return DynamicGenerator(model, PagedCache(model, max_tokens=2048, page_size=16), tok, max_chunk_size=64)


def prompt_ids(n: int) -> torch.Tensor:
    return torch.randint(10, 40000, (1, n), generator=torch.Generator().manual_seed(3))


def run(gen, jobs):
    """Run to the end checking the page table each step; per job its tokens, plus the steps each job decoded in."""
    tokens = {j: [] for j in jobs}
    steps = {j: [] for j in jobs}
    pages = {}
    gen.enqueue(list(jobs))
    step = 0
    while gen.num_remaining_jobs():
        step += 1
        for r in gen.iterate():
            if r["stage"] == "streaming":
                tokens[r["job"]] += r["token_ids"]
                steps[r["job"]].append(step)
        check_table(gen.pagetable, live_sequences(gen))
        pages.update({j: list(j.seq.pages) for j in gen.active})
    check_released(gen.pagetable)
    return [tokens[j] for j in jobs], [steps[j] for j in jobs], [pages[j] for j in jobs]


def test_greedy_alternatives_prefill_once_share_pages_and_equal_the_solo_run(tiny):
    ids, n = prompt_ids(150), 12  # 9 full pages of 16 and a partial one; prefilled in three chunks
    solo_gen = make_gen(tiny)
    (solo,), _, _ = run(solo_gen, [DynamicJob(ids, n, gen_settings=SamplerSettings.greedy())])
    gen = make_gen(tiny)
    jobs = [DynamicJob(ids, n, gen_settings=SamplerSettings.greedy()) for _ in range(4)]
    toks, steps, pages = run(gen, jobs)
    assert toks == [solo] * 4
    c = gen.counters
    assert c.prefill_tokens_total == 150  # once, not four times
    assert c.prefix_hit_tokens_total == 3 * 149  # the followers found all but their last prompt token cached
    assert [j.cached_tokens for j in jobs] == [0, 149, 149, 149]
    for p in pages[1:]:  # the full prompt pages are the leader's pages
        assert p[:9] == pages[0][:9]
    # The followers start one step after the leader's last prefill chunk and then decode alongside it.
    assert steps[1] == steps[2] == steps[3] == [s + 1 for s in steps[0]]


def test_seeded_alternatives_differ_and_are_reproducible(tiny):
    ids = prompt_ids(40)
    settings = SamplerSettings(temperature=1.5, top_k=0, top_p=1.0)

    def alternatives():
        return run(make_gen(tiny), [DynamicJob(ids, 16, gen_settings=settings, seed=7 + i) for i in range(3)])[0]

    first = alternatives()
    assert len({tuple(t) for t in first}) == 3
    assert alternatives() == first
    solo, _, _ = run(make_gen(tiny), [DynamicJob(ids, 16, gen_settings=settings, seed=8)])
    assert solo[0] == first[1]  # alternative i with seed s + i is the solo run with that seed


def test_a_different_prompt_does_not_wait_and_a_cancelled_leader_frees_its_followers(tiny):
    gen = make_gen(tiny)
    ids = prompt_ids(150)
    other = torch.randint(10, 40000, (1, 150), generator=torch.Generator().manual_seed(4))
    leader, follower = DynamicJob(ids, 4), DynamicJob(ids, 4)
    stranger = DynamicJob(other, 4)
    gen.enqueue([leader, follower, stranger])
    gen.iterate()
    assert leader in gen.active and stranger in gen.active and follower in gen.pending
    gen.cancel(leader)
    gen.iterate()
    assert follower in gen.active  # nobody prefills its prompt any more: it prefills it itself
    gen.clear_queue()
    check_released(gen.pagetable)

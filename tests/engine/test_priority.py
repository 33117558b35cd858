"""Priority scheduling: a better-ranked job arriving at a full cache takes the pages of the worst-ranked
running one, set_priority re-ranks queued and running jobs at the next step, queued jobs start in rank order
(ties in arrival order), and every output still equals its job's solo run."""
from __future__ import annotations

import threading

import pytest

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, Tokenizer
from engine.contract import CACHED
from tests.engine.pagetable_checks import check_released
from tests.engine.test_generator import GREEDY, prompt_ids
from tests.engine.test_preemption import checked, run

PS = 16


@pytest.fixture(scope="module")
def weights(tiny_llama_folder):
    return Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)


def generator(weights, pages, **kw):
    model, tok = weights
    return DynamicGenerator(model, PagedCache(model, max_tokens=pages * PS, page_size=PS), tok,
                            max_chunk_size=PS, **kw)


def solo(weights, ids, n):
    return run(generator(weights, 64), [DynamicJob(ids, n, gen_settings=GREEDY)])[0][0][0]


class Stream:
    """Steps a generator, keeping every job's streamed token ids (checking the page table after each step)."""

    def __init__(self, gen):
        self.gen, self.tokens = gen, {}

    def step(self):
        for r in self.gen.iterate():
            if r["stage"] == "streaming":
                self.tokens.setdefault(id(r["job"]), []).extend(r["token_ids"])
        checked(self.gen)

    def until(self, done, limit=400):
        for _ in range(limit):
            if done():
                return
            self.step()
        raise AssertionError("the condition never came true")

    def finish(self, jobs):
        while self.gen.num_remaining_jobs():
            self.step()
        return [self.tokens.get(id(j), []) for j in jobs]


def test_a_better_ranked_arrival_takes_the_pages_of_the_worst_running_job(weights):
    """Eight pages: 'low' (priority 5) and 'mid' (priority 1) fill them; 'urgent' (priority 0) arrives and
    is admitted in that very step by preempting low (the worst), never mid."""
    gen = generator(weights, 8)
    low = DynamicJob(prompt_ids(30, 1), 50, gen_settings=GREEDY, priority=5)
    mid = DynamicJob(prompt_ids(20, 2), 40, gen_settings=GREEDY, priority=1)
    gen.enqueue([low, mid])
    stream = Stream(gen)
    stream.until(lambda: low.new_tokens >= 20 and not gen.pending)
    urgent = DynamicJob(prompt_ids(40, 3), 20, gen_settings=GREEDY, priority=0)
    gen.enqueue(urgent)
    assert not gen.growth.can_admit(urgent, gen.active)  # too few pages for it unless someone gives theirs
    stream.step()
    assert urgent in gen.active and low in gen.pending and mid in gen.active
    assert (low.preemptions, mid.preemptions) == (1, 0)
    m = gen.metrics()
    kept = [p for p, serial in m["preempted_pages"].items() if serial == low.serial]
    assert kept and all(m["page_states"][p] == CACHED for p in kept)  # its K/V, still in the prompt cache
    assert m["job_preemptions"][low.serial]["preemptions"] == 1
    assert m["page_owner_identifiers"][low.serial] is None  # a queued job is named too (the map labels it)
    out = stream.finish([low, mid, urgent])
    assert mid.preemptions == 0 and low.resumes == low.preemptions
    after = gen.metrics()["job_preemptions"][low.serial]  # kept after it ended
    assert after["resumes"] == low.resumes and after["recomputed_tokens"] == low.recomputed_tokens
    assert gen.metrics()["preempted_pages"] == {}
    assert out == [solo(weights, prompt_ids(30, 1), 50), solo(weights, prompt_ids(20, 2), 40),
                   solo(weights, prompt_ids(40, 3), 20)]
    check_released(gen.pagetable)


def test_set_priority_makes_the_newly_worst_job_the_one_preempted(weights):
    """Two equal jobs on six pages: the later one would give its pages back. Re-ranking the earlier one below
    it (from another thread, applied at the next step) makes the earlier one the one preempted."""
    def pair():
        return [DynamicJob(prompt_ids(20, 1), 60, gen_settings=GREEDY),
                DynamicJob(prompt_ids(20, 2), 60, gen_settings=GREEDY)]

    plain = generator(weights, 6)
    a, b = pair()
    run(plain, [a, b], checked)
    assert a.preemptions == 0 and b.preemptions > 0  # the default: the later job yields

    gen = generator(weights, 6)
    first, second = pair()
    gen.enqueue([first, second])
    stream = Stream(gen)
    stream.until(lambda: first.new_tokens >= 2 and second.new_tokens >= 2)
    t = threading.Thread(target=gen.set_priority, args=(first, 1))
    t.start()
    t.join()
    assert first.priority == 0  # not before the next step
    out = stream.finish([first, second])
    assert first.priority == 1
    assert first.preemptions > 0 and second.preemptions == 0
    assert out == [solo(weights, prompt_ids(20, i), 60) for i in (1, 2)]


def test_raising_a_preempted_jobs_priority_resumes_it_at_once(weights):
    """The later of two equal jobs was preempted; ranked first now, it takes the other's pages at the next
    step instead of waiting for it to finish."""
    gen = generator(weights, 6)
    first = DynamicJob(prompt_ids(20, 1), 60, gen_settings=GREEDY)
    second = DynamicJob(prompt_ids(20, 2), 60, gen_settings=GREEDY)
    gen.enqueue([first, second])
    stream = Stream(gen)
    stream.until(lambda: second in gen.pending and second.started)
    gen.set_priority(second, -1)
    stream.step()
    assert second in gen.active and first in gen.pending and first.preemptions == 1
    assert stream.finish([first, second]) == [solo(weights, prompt_ids(20, i), 60) for i in (1, 2)]
    check_released(gen.pagetable)


def test_set_priority_before_enqueue_after_the_end_and_refusing_a_non_int(weights):
    """A job re-ranked before it is enqueued (DynamicJobAsync enqueues on the worker thread) starts ranked so."""
    gen = generator(weights, 64, max_batch_size=1)
    first = DynamicJob(prompt_ids(10, 1), 5, gen_settings=GREEDY, identifier="first")
    job = DynamicJob(prompt_ids(10), 5, gen_settings=GREEDY, identifier="job")
    gen.set_priority(job, -1)
    gen.iterate()  # a step before it is enqueued must not lose it
    gen.enqueue([first, job])
    assert [r["identifier"] for r in gen.iterate() if r["stage"] == "started"] == ["job"]
    with pytest.raises(ValueError, match="priority must be an int"):
        gen.set_priority(job, "high")
    Stream(gen).finish([first, job])
    gen.set_priority(job, 3)  # ended meanwhile: nothing left to rank, no error on the next step
    gen.iterate()


def test_queued_jobs_start_in_rank_order_ties_in_arrival_order(weights):
    gen = generator(weights, 64, max_batch_size=1)
    priorities = [3, 1, 2, 1, 0, 3]
    jobs = [DynamicJob(prompt_ids(8, i), 3, gen_settings=GREEDY, priority=p, identifier=i)
            for i, p in enumerate(priorities)]
    gen.enqueue(jobs)
    started = []
    while gen.num_remaining_jobs():
        started += [r["identifier"] for r in gen.iterate() if r["stage"] == "started"]
    assert started == [4, 1, 3, 2, 0, 5]

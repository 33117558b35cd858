"""Pages on demand in the generator: jobs start with their prompt's pages and grow; when the cache runs dry
the newest running job gives its pages back and later resumes, and its output is exactly what it would have
been alone (greedy and seeded sampling, stop strings, banned-string rewinds, filters), on dense and on packed
(q8) weights."""
from __future__ import annotations

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from engine.generator.filters import RegexFilter
from tests.engine.pagetable_checks import check_released, check_table, live_sequences
from tests.engine.test_generator import GREEDY, prompt_ids

PS = 16


@pytest.fixture(scope="module", params=["dense", "q8"])
def weights(request, tiny_llama_folder):
    return Model.load(tiny_llama_folder, weights=request.param), Tokenizer.load(tiny_llama_folder)


def generator(weights, max_tokens, **kw):
    model, tok = weights
    return DynamicGenerator(model, PagedCache(model, max_tokens=max_tokens, page_size=PS), tok, **kw)


def run(gen, jobs, each_step=None):
    """Iterate until all jobs end; per job: (token ids, streamed text, suppressed texts, eos reason)."""
    out = {id(j): [[], "", [], None] for j in jobs}
    gen.enqueue(list(jobs))
    peak = 0
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] != "streaming":
                continue
            o = out[id(r["job"])]
            o[0] += r["token_ids"]
            o[1] += r["text"]
            if "suppressed_text" in r:
                o[2].append(r["suppressed_text"])
            if r["eos"]:
                o[3] = r["eos_reason"]
        peak = max(peak, len(gen.active))
        if each_step is not None:
            each_step(gen)
    return [tuple(out[id(j)][:2]) + (tuple(out[id(j)][2]), out[id(j)][3]) for j in jobs], peak


def word_from(text, where):
    words = [w for w in text.split() if len(w) >= 3]
    assert words, text
    return words[int(len(words) * where)]


def checked(gen):
    check_table(gen.pagetable, live_sequences(gen))  # refcounts = live owners, names = chained hashes
    for job in gen.pending:
        assert all(not s.pages for s in job.seqs)  # a preempted job holds no page


def test_output_under_heavy_preemption_equals_solo_runs(weights):
    _, tok = weights
    prompts = [prompt_ids(n, seed) for seed, n in enumerate([12, 40, 25, 60, 9, 33, 18])]
    n_new = 40
    # Free runs pick a banned word and a stop word that really occur in those prompts' replies.
    free, _ = run(generator(weights, 2048), [DynamicJob(prompts[i], n_new, gen_settings=GREEDY) for i in (2, 3)])
    banned, stop = word_from(free[0][1], 0.5), word_from(free[1][1], 0.6)

    def jobs():
        hot = SamplerSettings(temperature=1.5, top_k=0, top_p=1.0)
        return [
            DynamicJob(prompts[0], n_new, gen_settings=GREEDY),
            DynamicJob(prompts[1], n_new, gen_settings=hot, seed=7),
            DynamicJob(prompts[2], n_new, gen_settings=GREEDY, banned_strings=[banned]),
            DynamicJob(prompts[3], n_new, gen_settings=GREEDY, stop_conditions=[stop]),
            DynamicJob(prompts[4], n_new, gen_settings=GREEDY, filters=[RegexFilter(r"[a-z ]{1,400}")]),
            DynamicJob(prompts[5], n_new, gen_settings=hot, seed=3),
            DynamicJob(prompts[6], n_new, gen_settings=GREEDY),
        ]

    solo = [run(generator(weights, 2048), [job])[0][0] for job in jobs()]
    assert solo[2][2] and banned not in solo[2][1]  # the ban really rewound something
    assert solo[3][3] == "stop_string"
    # 8 pages of 16: one reply (up to 100 tokens, 7 pages) fits; seven at once force preemption all the time.
    gen = generator(weights, 8 * PS, max_chunk_size=PS)
    squeezed, peak = run(gen, jobs(), checked)
    assert squeezed == solo
    m = gen.metrics()
    assert m["preemptions_total"] >= 2 and m["resumes_total"] == m["preemptions_total"], m
    assert m["recomputed_tokens_total"] > 0  # some K/V was evicted while its job waited, and recomputed
    assert peak >= 3  # whole reservations would have run one job at a time
    check_released(gen.pagetable)


def test_jobs_without_a_limit_run_until_the_context_is_full(weights):
    """16 jobs with no max_new_tokens on a cache that holds four whole contexts: all finish, more than four
    run at once, and a preempted job cancelled while it waits leaves nothing behind."""
    ctx = 64
    prompts = [prompt_ids(5 + 3 * i, 100 + i) for i in range(16)]
    roomy = generator(weights, 16 * ctx, max_seq_len=ctx)
    alone, roomy_peak = run(roomy, [DynamicJob(p, gen_settings=GREEDY) for p in prompts])
    assert roomy_peak == 16 and roomy.metrics()["preemptions_total"] == 0
    for (toks, _, _, reason), p in zip(alone, prompts):
        assert len(toks) == ctx - p.shape[1] and reason == "max_new_tokens"

    gen = generator(weights, 4 * ctx, max_seq_len=ctx)
    jobs = [DynamicJob(p, gen_settings=GREEDY) for p in prompts]
    cancelled = []

    def step(g):
        checked(g)
        waiting = [j for j in g.pending if j.started]
        if waiting and not cancelled and g.metrics()["steps_total"] > 20:
            cancelled.append(waiting[0])
            g.cancel(waiting[0])

    squeezed, peak = run(gen, jobs, step)
    assert cancelled and peak > 4
    for i, job in enumerate(jobs):
        if job is not cancelled[0]:
            assert squeezed[i] == alone[i], i
    assert gen.metrics()["preemptions_total"] > 0
    check_released(gen.pagetable)


def test_priority_decides_who_is_preempted(weights):
    gen = generator(weights, 6 * PS, max_chunk_size=PS)
    first = DynamicJob(prompt_ids(20, 1), 60, gen_settings=GREEDY, priority=1)  # enqueued first, ranks lower
    second = DynamicJob(prompt_ids(20, 2), 60, gen_settings=GREEDY)
    (a, b), _ = run(gen, [first, second], checked)
    assert first.preemptions > 0 and second.preemptions == 0
    assert (a, b) == tuple(run(generator(weights, 1024), [DynamicJob(prompt_ids(20, i), 60, gen_settings=GREEDY)])[0][0]
                           for i in (1, 2))


def test_a_queued_jobs_pages_outlast_a_finished_jobs(weights):
    """Pages a preempted job will resume from are recycled after a finished job's: here job 3, preempted, waits
    while job 4 grows past the moment job 2 ends, and job 4's new pages come from job 2's cache, not job 3's
    (with plain LRU job 3 recomputes 31 tokens instead of 15). Every output is still the solo run's."""
    lens = [53, 26, 50, 38, 139]
    gen = generator(weights, 10 * PS, max_chunk_size=PS, max_seq_len=256)
    jobs = [DynamicJob(prompt_ids(10, i), n, gen_settings=GREEDY) for i, n in enumerate(lens)]
    squeezed, _ = run(gen, jobs, checked)
    assert [j.recomputed_tokens for j in jobs] == [0, 0, 0, 15, 29]
    for i, n in enumerate(lens):
        alone = run(generator(weights, 1024, max_seq_len=256), [DynamicJob(prompt_ids(10, i), n, gen_settings=GREEDY)])
        assert squeezed[i] == alone[0][0], i
    check_released(gen.pagetable)


def test_a_job_the_whole_cache_cannot_hold_is_refused_alone(weights):
    gen = generator(weights, 4 * PS, max_seq_len=256)
    ok = DynamicJob(prompt_ids(10), 20, gen_settings=GREEDY)
    gen.enqueue(ok)
    with pytest.raises(ValueError, match="whole cache"):
        gen.enqueue(DynamicJob(prompt_ids(30), 40, gen_settings=GREEDY))
    while gen.num_remaining_jobs():
        gen.iterate()
    assert ok.new_tokens == 20
    check_released(gen.pagetable)


def test_drafting_jobs_under_preemption_equal_solo_runs(tiny_llama_folder):
    """n-gram drafts take pages only where free (never preempting for them) and refilled K/V serves them."""
    weights = Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)
    loop = prompt_ids(8, 50)[0].tolist()
    prompts = [torch.tensor([loop * (2 + i)]) for i in range(5)]  # repeating: the n-gram index proposes drafts
    solo = [run(generator(weights, 1024), [DynamicJob(p, 48, gen_settings=GREEDY)])[0][0] for p in prompts]
    gen = generator(weights, 8 * PS, max_chunk_size=PS, use_ngram_draft=True)
    squeezed, _ = run(gen, [DynamicJob(p, 48, gen_settings=GREEDY) for p in prompts], checked)
    assert squeezed == solo
    m = gen.metrics()
    assert m["preemptions_total"] > 0 and m["drafted_tokens_total"] > 0
    check_released(gen.pagetable)

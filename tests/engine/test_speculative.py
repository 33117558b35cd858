"""Speculative decoding: greedy output is unchanged, drafts are accepted as they should be, stats add up."""
from __future__ import annotations

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from engine.generator.ngram import NgramIndex
from tests.engine.test_generator import GREEDY, naive_greedy, prompt_ids, run_all
from tests.tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    main = write_tiny_model(root / "main", arch="llama", seed=0)
    other = write_tiny_model(root / "draft", arch="llama", seed=1)
    return Model.load(main), Model.load(main), Model.load(other), Tokenizer.load(main)


def gen_with(model, tok, draft=None, **kw):
    cache = PagedCache(model, 1024, 16)
    dcache = PagedCache(draft, 1024, 16) if draft is not None else None
    return DynamicGenerator(model, cache, tok, draft_model=draft, draft_cache=dcache, **kw)


def test_ngram_index_proposes_what_followed_the_longest_suffix():
    idx = NgramIndex(3)
    toks = [1, 2, 3, 4, 5, 9, 2, 3]
    assert idx.propose(toks, 3) == [4, 5, 9]
    assert idx.propose([7, 8], 2) == []


def test_identical_draft_model_is_accepted_and_output_unchanged(tiny):
    model, same, _, tok = tiny
    ids = prompt_ids(30, 1)
    gen = gen_with(model, tok, draft=same, num_draft_tokens=4)
    (toks,), (fin,) = run_all(gen, [DynamicJob(ids, 33, gen_settings=GREEDY)])
    assert toks == naive_greedy(model, ids, 33)
    assert fin["accepted_draft_tokens"] > 0.9 * (fin["accepted_draft_tokens"] + fin["rejected_draft_tokens"])
    m = gen.metrics()
    assert m["drafted_tokens_total"] > 0 and m["accepted_per_position"][0] > 0
    # Several tokens per step: far fewer steps than tokens.
    assert m["steps_total"] < 20


def test_different_draft_model_keeps_greedy_output(tiny):
    model, _, other, tok = tiny
    prompts = [prompt_ids(20 + 7 * i, 10 + i) for i in range(3)]
    gen = gen_with(model, tok, draft=other, num_draft_tokens=3)
    toks, finals = run_all(gen, [DynamicJob(p, 24, gen_settings=GREEDY) for p in prompts])
    assert toks == [naive_greedy(model, p, 24) for p in prompts]
    assert all(f["rejected_draft_tokens"] > 0 for f in finals)  # a random draft is mostly wrong
    assert all(p.ref_count == 0 for p in gen.pagetable.pages)


def test_ngram_drafting_on_repetitive_prompt(tiny):
    model, _, _, tok = tiny
    unit = prompt_ids(12, 3)
    ids = unit.repeat(1, 4)
    plain, _ = run_all(gen_with(model, tok), [DynamicJob(ids, 30, gen_settings=GREEDY)])
    gen = gen_with(model, tok, use_ngram_draft=True, max_ngram=4, num_draft_tokens=4)
    spec, (fin,) = run_all(gen, [DynamicJob(ids, 30, gen_settings=GREEDY)])
    assert spec == plain
    assert fin["accepted_draft_tokens"] + fin["rejected_draft_tokens"] > 0


def test_sampled_output_with_draft_keeps_seeded_distribution(tiny):
    model, same, _, tok = tiny
    s = SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, token_repetition_penalty=1.0)
    ids = prompt_ids(10, 4)
    plain, _ = run_all(gen_with(model, tok), [DynamicJob(ids, 20, gen_settings=s, seed=3)])
    spec, _ = run_all(gen_with(model, tok, draft=same), [DynamicJob(ids, 20, gen_settings=s, seed=3)])
    # Exact-match acceptance draws each token from the target distribution with the job's own RNG stream,
    # so with an identical draft model the seeded sample path is the same as without speculation.
    assert spec == plain


def test_speculation_is_skipped_above_the_batch_threshold(tiny):
    model, same, _, tok = tiny
    gen = gen_with(model, tok, draft=same, max_draft_batch_size=2)
    run_all(gen, [DynamicJob(prompt_ids(8, i), 6, gen_settings=GREEDY) for i in range(3)])
    assert gen.metrics()["drafted_tokens_total"] == 0


def test_draft_model_computes_what_cached_pages_lack(tiny):
    """Pages cached by jobs that never ran the draft model (CFG here; filtered jobs and big batches too) hold no
    draft K/V: a later job must not take them as drafted, or every draft is rejected (output stays right)."""
    model, same, _, tok = tiny
    ids = prompt_ids(40, 21)
    longer = torch.cat([ids, prompt_ids(30, 22)], dim=1)
    gen = gen_with(model, tok, draft=same, num_draft_tokens=4)
    run_all(gen, [DynamicJob([ids, prompt_ids(12, 23)], 6, gen_settings=SamplerSettings.greedy(cfg_scale=1.5))])
    for prompt in (longer, ids):  # cached then prefilled (the draft model catches up in prefill); wholly cached
        (toks,), (fin,) = run_all(gen, [DynamicJob(prompt, 24, gen_settings=GREEDY)])
        assert fin["cached_tokens"] >= 32 and toks == naive_greedy(model, prompt, 24)
        assert fin["accepted_draft_tokens"] > 0.9 * (fin["accepted_draft_tokens"] + fin["rejected_draft_tokens"])
    cached = [p for p in gen.pagetable.pages if p.kv_position]
    assert any(p.draft_position == 0 for p in cached) and any(p.draft_position == 16 for p in cached)


def test_draft_settings_are_checked(tiny):
    model, same, _, tok = tiny
    with pytest.raises(ValueError, match="draft_cache"):
        DynamicGenerator(model, PagedCache(model, 256, 16), tok, draft_model=same)
    with pytest.raises(ValueError, match="same number of pages"):
        DynamicGenerator(model, PagedCache(model, 256, 16), tok, draft_model=same, draft_cache=PagedCache(same, 512, 16))
    with pytest.raises(ValueError, match="choose one"):
        DynamicGenerator(model, PagedCache(model, 256, 16), tok, draft_model=same,
                         draft_cache=PagedCache(same, 256, 16), use_ngram_draft=True)

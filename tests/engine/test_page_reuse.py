"""Model-level oracle for page reuse (prefix cache, dedup of generated pages).

A text whose continuation repeats whole pages, run once, run again and run as two concurrent copies, must
give the tokens and logits of one forward pass over the whole text; after every step no block table holds a
physical page twice and every full page is named by the chained hash of its own tokens
(tests/engine/pagetable_checks.py). The old dedup bug gave the re-run K/V of other positions: logits off by 2 to 45.
"""
from __future__ import annotations

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from tests.engine.pagetable_checks import check_released, check_table, live_sequences
from tests.tiny_models import write_tiny_model
from tools.logits import forward_tokens

TOLERANCE = 1e-3  # dense fp32; the paged path differs from one pass by ~1e-4 at most


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    """A tiny random Llama with room for several 256-token pages (a small vocabulary keeps logits cheap)."""
    folder = write_tiny_model(tmp_path_factory.mktemp("reuse") / "llama", max_position_embeddings=2048, vocab_size=1024)
    return Model.load(folder), Tokenizer.load(folder)


def run_checked(gen: DynamicGenerator, jobs: list[DynamicJob]):
    """Run jobs to the end, checking the page table after every step; per job: tokens, logits, page objects."""
    tokens = {job: [] for job in jobs}
    logits = {job: [] for job in jobs}
    pages = {}
    gen.enqueue(list(jobs))
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                tokens[r["job"]] += r["token_ids"]
                logits[r["job"]].append(r["logits"])
        check_table(gen.pagetable, live_sequences(gen))
        pages.update({job: list(job.seq.pages) for job in gen.active})
    check_released(gen.pagetable)
    return [(tokens[j], torch.cat(logits[j]), pages[j], j.cached_tokens) for j in jobs]


def assert_like_one_pass(model, prompt, runs, n):
    """Every run generated the same tokens, with the logits one forward over the whole text gives."""
    text = prompt + runs[0][0]
    want = forward_tokens(model, torch.tensor([text]))[len(prompt) - 1 : len(prompt) - 1 + n]
    for toks, logits, _, _ in runs:
        assert toks == runs[0][0]
        diff = (logits[:, : model.vocab_size] - want).abs().max().item()
        assert diff < TOLERANCE, f"logits differ from one pass by {diff}"
    return want


def repeat_three_times(model, tok, prompt, n, page_size, settings):
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=16 * page_size, page_size=page_size), tok)

    def jobs(k):
        return [DynamicJob(torch.tensor([prompt]), n, gen_settings=settings, return_logits=True) for _ in range(k)]

    first = run_checked(gen, jobs(1))
    again = run_checked(gen, jobs(1))
    copies = run_checked(gen, jobs(2))
    return first, again, copies


@pytest.mark.parametrize("page_size", [16, 256])
def test_repeating_text_rerun_and_copies_match_one_pass(long_tiny, page_size):
    model, tok = long_tiny
    prompt = [100, 200, 300, 400] * (page_size // 4)  # periodic and page-aligned
    n = 2 * page_size + 8  # two full generated pages, then part of a third
    # A random tiny model never repeats itself; a bias on one token makes every generated page the same
    # (the logits compared below are the model's raw ones).
    settings = SamplerSettings.greedy(token_bias={700: 1e4})
    first, again, copies = repeat_three_times(model, tok, prompt, n, page_size, settings)
    assert first[0][0] == [700] * n
    assert_like_one_pass(model, prompt, first + again + copies, n)
    full = len(prompt) // page_size + 2
    assert again[0][3] == len(prompt) - 1  # the prompt came from the cache
    for _, _, pages, _ in again + copies:  # each full page deduplicated onto the first run's page for its position
        assert pages[:full] == first[0][2][:full]


@pytest.mark.slow
def test_default_model_repeating_prompt_rerun_and_copies_match_one_pass():
    """The issue's end-to-end case: SmolLM2 continues ' one two three four' x 8 by itself (page size 16)."""
    model, tok = Model.load(weights="dense"), Tokenizer.load()
    prompt = tok.encode(" one two three four" * 8)[0].tolist()
    assert len(prompt) == 32 and prompt[:4] * 8 == prompt  # four tokens a period: two whole pages
    n = 48  # the continuation repeats the period, filling two whole pages of the same tokens
    first, again, copies = repeat_three_times(model, tok, prompt, n, 16, SamplerSettings.greedy())
    assert first[0][0] == prompt[:4] * 12
    want = assert_like_one_pass(model, prompt, first + again + copies, n)
    assert want.argmax(dim=-1).tolist() == first[0][0]  # greedy tokens are the one pass's argmax
    for _, _, pages, _ in again + copies:
        assert pages[:4] == first[0][2][:4]


def test_fresh_concurrent_copies_and_a_cfg_pair_match_one_pass(long_tiny):
    """Copies sharing the same pages (the second waits for the first's prefill, then reuses it), and a CFG pair whose two sequences share
    their prompt and deduplicate their generated pages onto each other (same owner twice on a page)."""
    model, tok = long_tiny
    prompt, n = [100, 200, 300, 400] * 8, 40
    ids = torch.tensor([prompt])
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=512, page_size=16), tok, max_chunk_size=16)
    biased = {700: 1e4}
    copies = run_checked(gen, [DynamicJob(ids, n, gen_settings=SamplerSettings.greedy(token_bias=biased),
                                          return_logits=True) for _ in range(2)])
    assert copies[0][2][:2] == copies[1][2][:2]  # the prompt's pages are shared from the start
    assert_like_one_pass(model, prompt, copies, n)
    gen.reset_page_table()
    pair = DynamicJob([ids, ids], n, gen_settings=SamplerSettings.greedy(token_bias=biased, cfg_scale=2.0),
                      return_logits=True)
    seqs = pair.seqs
    cfg = run_checked(gen, [pair])
    assert seqs[0].pages[:4] == seqs[1].pages[:4]  # generated pages too: the second deduplicated onto the first
    assert_like_one_pass(model, prompt, copies + cfg, n)


def test_default_model_packed_prompt_found_in_the_cache_gives_a_fresh_runs_bits():
    """Chat prompts run together, then each again on the same generator (its prompt found in the cache but for
    its last token, or sharing a partial page with another's), give the tokens and logits of a fresh generator,
    bit for bit: a prompt token fed alone takes the prompt rows' path, whose few-row products give the bits of
    a longer call (dense_weights.MIN_ROWS)."""
    model, tok = Model.load(weights="packed"), Tokenizer.load()
    tok.set_chat_format("auto")
    questions = ["Name three rivers in Europe.", "Write a haiku about snow.", "Say hello in French."]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True),
                          encode_special_tokens=True)[0].tolist() for q in questions]

    def generator():
        return DynamicGenerator(model, PagedCache(model, max_tokens=4096, page_size=256), tok)

    def jobs(ps):
        return [DynamicJob(torch.tensor([p]), 24, gen_settings=SamplerSettings.greedy(), return_logits=True)
                for p in ps]

    fresh = [run_checked(generator(), jobs([p]))[0] for p in prompts]
    shared = generator()
    together = run_checked(shared, jobs(prompts))
    again = [run_checked(shared, jobs([p]))[0] for p in prompts]
    assert [r[3] for r in again] == [len(p) - 1 for p in prompts]  # all but the last prompt token cached
    for i, (want, a, b) in enumerate(zip(fresh, together, again)):
        for got in (a, b):
            assert got[0] == want[0], i
            assert torch.equal(got[1], want[1]), i

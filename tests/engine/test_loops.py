"""LoopGuard's two definitions of a loop (engine/generator/loops.py), and a job with stop_on_loops ending
with eos_reason "repetition" and its pages freed."""
from __future__ import annotations

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from engine.contract import EOS_REASONS
from engine.generator.loops import LoopGuard
from engine.server.responses import FINISH_REASONS
from tests.engine.pagetable_checks import check_released


def first_loop_at(guard: LoopGuard, tokens: list[int]) -> int | None:
    """1-based index of the token at which the guard finds a loop (fed one at a time), None if never."""
    for i, token in enumerate(tokens, 1):
        if guard.feed([token]):
            return i
    return None


def units_until_loop(guard: LoopGuard, units: list[str]) -> int | None:
    """1-based index of the unit of text whose end makes the guard find a loop, None if never."""
    for i, unit in enumerate(units, 1):
        if guard.feed([], unit):
            return i
    return None


def test_a_repeated_token_block_is_stopped_at_its_fourth_copy():
    block = list(range(100, 115))  # a 15-token sentence: 4 copies = 60 tokens >= 48
    assert first_loop_at(LoopGuard(), list(range(500, 530)) + block * 6) == 30 + 4 * 15
    assert LoopGuard().feed(block * 4)


def test_a_short_period_needs_the_minimum_span():
    assert first_loop_at(LoopGuard(), [7] * 100) == 48  # one word 48 times
    assert first_loop_at(LoopGuard(), [7, 8] * 100) == 48  # a 2-token phrase 24 times
    guard = LoopGuard()
    assert guard.feed([7] * 47) is False and guard.feed([7]) and "1-token block" in guard.found


def test_a_repeated_sentence_is_stopped_at_its_fourth_occurrence_whatever_its_list_marker():
    sentence = "The soul finds its own rhythm in the quiet of the night."
    units = ["Here is a poem.\n", f"1. {sentence}\n", "It sings.\n", f"2. {sentence}\n", f"- {sentence} ",
             "And more.\n", f"* {sentence.upper()}\n", "Never reached.\n"]
    guard = LoopGuard()
    assert units_until_loop(guard, units) == 7
    assert "repeated 4 times" in guard.found


def test_text_split_anywhere_gives_the_same_verdict():
    text = "Intro line here.\n" + "We walk along the shore together. " * 3 + "Then home.\n"
    whole = LoopGuard()
    assert whole.feed([], text) is False
    assert whole.feed([], "We walk along the shore together. ")
    chars = LoopGuard()
    assert units_until_loop(chars, list(text + "We walk along the shore together. ")) == len(text) + 34


def test_normal_text_is_not_a_loop():
    reply = (
        "Sure! Here are some ideas:\n\n"
        + "".join(f"- {food}\n" for food in ("Eggs", "Oatmeal", "Yogurt with fruit", "Toast", "Eggs"))
        + "Yes.\nYes.\nYes.\nYes.\nOk, very very very very good.\n"
        + "```python\n" + "    assert check(value, expected) is True\n" * 6 + "```\n"
        + "Step 1: mix the flour and the milk well.\nStep 2: mix the eggs and the sugar well.\n"
    )
    guard = LoopGuard()
    assert guard.feed([], reply) is False
    assert LoopGuard().feed(list(range(200)), reply) is False
    assert first_loop_at(LoopGuard(), [1, 2, 3, 4, 5] * 3 + [9] * 20) is None  # a short run, short repeats


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="repeats >= 2"):
        LoopGuard(repeats=1)


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder):
    return Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)


def test_a_looping_job_ends_with_repetition_and_frees_its_pages(tiny):
    """A random tiny model never repeats itself; a bias on one token makes it loop on that token."""
    model, tok = tiny
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), tok)
    settings = SamplerSettings.greedy(token_bias={700: 1e4})
    prompt = torch.randint(10, 1000, (1, 20), generator=torch.Generator().manual_seed(0))
    guarded = DynamicJob(prompt, 200, gen_settings=settings, stop_on_loops=True)
    plain = DynamicJob(prompt.clone(), 60, gen_settings=settings)
    ends = {}
    gen.enqueue([guarded, plain])
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming" and r["eos"]:
                ends[r["job"]] = r
    assert ends[guarded]["eos_reason"] == "repetition" and ends[guarded]["new_tokens"] == 48
    assert ends[plain]["eos_reason"] == "max_new_tokens" and ends[plain]["new_tokens"] == 60
    check_released(gen.pagetable)
    assert all(p.ref_count == 0 for p in gen.pagetable.pages)


def test_the_server_reports_a_stopped_loop_as_finish_reason_stop():
    """Every way a job can end has an OpenAI finish_reason (a cancelled job sends none: its client left)."""
    assert set(FINISH_REASONS) == set(EOS_REASONS) - {"cancelled"}
    assert FINISH_REASONS["repetition"] == "stop"

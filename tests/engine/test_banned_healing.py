"""Banned strings rewind and never stream; token healing re-generates the prompt's last token."""
from __future__ import annotations

import pytest

from engine import DynamicJob
from tests.engine.test_generator import GREEDY, make_gen, prompt_ids, run_all, tiny  # noqa: F401  (fixture)


def stream_text(gen, job):
    gen.enqueue(job)
    text, suppressed, final = "", [], None
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                text += r["text"]
                if "suppressed_text" in r:
                    suppressed.append(r["suppressed_text"])
                if r["eos"]:
                    final = r
    return text, suppressed, final


def test_banned_string_is_rewound_and_never_streamed(tiny):
    ids = prompt_ids(15, 21)
    free, _, _ = stream_text(make_gen(tiny), DynamicJob(ids, 24, gen_settings=GREEDY))
    words = [w for w in free.split() if len(w) >= 3]
    assert words, free
    banned = words[len(words) // 2]
    gen = make_gen(tiny)
    text, suppressed, final = stream_text(gen, DynamicJob(ids, 24, gen_settings=GREEDY, banned_strings=[banned.upper()]))
    assert banned.lower() not in text.lower()
    assert any(banned.lower() in s.lower() for s in suppressed)
    assert final["full_completion"] == text
    assert final["new_tokens"] == 24
    assert all(p.ref_count == 0 for p in gen.pagetable.pages)
    # Everything before the banned word was kept as it was.
    prefix = free[: free.lower().index(banned.lower())]
    assert text.startswith(prefix.rstrip()[: max(len(prefix) - 8, 0)])


def test_banned_strings_must_be_strings(tiny):
    with pytest.raises(ValueError, match="banned_strings"):
        DynamicJob(prompt_ids(4), 5, banned_strings="abc")


def test_token_healing_regenerates_last_prompt_token(tiny):
    model, tok = tiny
    ids = prompt_ids(12, 22)
    gen = make_gen(tiny)
    job = DynamicJob(ids, 8, gen_settings=GREEDY, token_healing=True)
    text, _, final = stream_text(gen, job)
    removed = tok.pieces[int(ids[0, -1])]
    first = job.seq.tokens[11]  # the first generated token sits where the removed one was
    assert tok.pieces[first].startswith(removed)
    assert final["prompt_tokens"] == 11
    # The stream continues the original prompt text: nothing of the removed token is repeated.
    full = tok.decode(job.seq.tokens)
    assert full == tok.decode(ids[0].tolist()) + text

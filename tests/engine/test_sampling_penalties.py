"""Context penalties of the sampler: repetition / frequency / presence (range, decay), token bias,
blocked tokens and DRY, checked on the processed logits against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.sampling.sampler import JobSampler
from engine.sampling.penalties import ContextCache
from tests.engine.test_sampling import P4, draws, final_dist, logits_for, plain


# ---------------------------------------------------------------------------------------------- penalties

def processed(settings, logits, vocab, context, **kw) -> np.ndarray:
    return JobSampler(settings, 0, vocab, **kw).process_logits(logits, context)


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    lg = torch.tensor([2.0, -2.0, 1.0, 0.5])
    out = processed(plain(token_repetition_penalty=2.0), lg, 4, [0, 1, 0])
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]
    # and lowers a repeated token's probability in the final distribution
    d0 = final_dist(plain(), logits_for(P4), 4)
    d1 = final_dist(plain(token_repetition_penalty=1.5), logits_for(P4), 4, context=[1])
    assert d1[1] < d0[1] and d1[0] > d0[0]


def test_repetition_range_and_decay():
    lg = torch.full((8,), 4.0)
    ctx = [1, 2, 3, 4, 5]  # distance from end: 5->0, 4->1, 3->2, 2->3, 1->4
    out = processed(plain(token_repetition_penalty=2.0, token_repetition_range=2), lg, 8, ctx)
    assert out.tolist() == [4, 4, 4, 4, 2, 2, 4, 4]
    out = processed(plain(token_repetition_penalty=2.0, token_repetition_range=1, token_repetition_decay=2),
                    lg, 8, ctx)
    # full penalty for 5 (d=0) and 4 (d=1, the first decay step still full); 3 (d=2) gets half of it
    assert out.tolist() == pytest.approx([4, 4, 4, 4 / 1.5, 2, 2, 4, 4])


def test_frequency_and_presence_penalties():
    lg = torch.zeros(4)
    out = processed(plain(token_frequency_penalty=0.5), lg, 4, [1, 1, 1, 2])
    assert out.tolist() == [0.0, -1.5, -0.5, 0.0]
    out = processed(plain(token_presence_penalty=0.5), lg, 4, [1, 1, 1, 2])
    assert out.tolist() == [0.0, -0.5, -0.5, 0.0]
    out = processed(plain(token_presence_penalty=-1.0), lg, 4, [3])  # negative encourages
    assert out.tolist() == [0.0, 0.0, 0.0, 1.0]


def test_context_ids_outside_vocab_are_ignored():
    out = processed(plain(token_frequency_penalty=1.0), torch.zeros(4), 4, [1, 10**9, 7, 1])
    assert out.tolist() == [0.0, -2.0, 0.0, 0.0]


def test_context_mirror_follows_rewinds_and_tensors():
    cache = ContextCache()
    ctx = [1, 2, 3]
    assert cache.array(ctx, -1).tolist() == [1, 2, 3]
    ctx += list(range(300))
    assert cache.array(ctx, -1).tolist() == [1, 2, 3] + list(range(300))
    del ctx[2:]
    ctx += [9, 9]  # rewound and regrown (banned-string rewind): same length family, different tokens
    assert cache.array(ctx, -1).tolist() == [1, 2, 9, 9]
    assert cache.array(ctx, 2).tolist() == [9, 9]
    assert cache.array(torch.tensor([5, 6, 7]), 2).tolist() == [6, 7]
    s = plain(token_frequency_penalty=0.3, token_repetition_penalty=1.2)
    js = JobSampler(s, 0, 4)
    for ctx in ([0, 1], [0, 1, 1], [0, 2], [3, 3, 3]):
        want = processed(s, logits_for(P4), 4, ctx)
        assert np.array_equal(js.process_logits(logits_for(P4), ctx), want)
        assert np.array_equal(js.process_logits(logits_for(P4), torch.tensor(ctx)), want)


def test_token_bias_and_blocked_tokens():
    d = final_dist(plain(token_bias={3: math.log(10.0)}), logits_for(P4), 4)
    w = np.array(P4) * [1, 1, 1, 10]
    assert [d[i] for i in range(4)] == pytest.approx((w / w.sum()).tolist(), rel=1e-5)
    assert 0 not in draws(plain(token_bias={0: float("-inf")}), logits_for(P4), 4, 300)
    js = JobSampler(plain(), 0, 4)
    assert all(js.sample(logits_for(P4), [], blocked_tokens=[0, 1]).token in (2, 3) for _ in range(200))


# ---------------------------------------------------------------------------------------------- DRY

DRY = dict(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2, dry_sequence_breakers=[])


def test_dry_penalizes_the_token_that_extends_a_repeat():
    ctx = [5, 6, 7, 8, 9, 1, 5, 6, 7]  # suffix "5 6 7" occurred before, followed by 8
    out = processed(plain(**DRY), torch.zeros(16), 16, ctx)
    assert out[8] == pytest.approx(-2.0)  # match length 3: 1.0 * 2 ** (3 - 2)
    assert np.count_nonzero(out) == 1
    d = final_dist(plain(**DRY), torch.zeros(16), 16, context=ctx)
    assert d[8] < d[0]


def test_dry_allowed_length_max_ngram_range_and_longest_match():
    ctx = [5, 6, 7, 8, 9, 1, 5, 6, 7]
    assert not processed(plain(**{**DRY, "dry_allowed_length": 4}), torch.zeros(16), 16, ctx).any()
    out = processed(plain(**{**DRY, "dry_max_ngram": 2}), torch.zeros(16), 16, ctx)
    assert out[8] == pytest.approx(-1.0)  # match capped at 2
    assert not processed(plain(**{**DRY, "dry_range": 4}), torch.zeros(16), 16, ctx).any()
    # two earlier occurrences: the longer match sets the penalty of its follower, each follower gets its own
    ctx = [6, 7, 3, 5, 6, 7, 4, 1, 5, 6, 7]
    out = processed(plain(**DRY), torch.zeros(16), 16, ctx)
    assert out[4] == pytest.approx(-2.0) and out[3] == pytest.approx(-1.0)


def test_dry_sequence_breakers_stop_matches():
    ctx = [5, 6, 7, 8, 9, 1, 5, 6, 7]
    assert not processed(plain(**{**DRY, "dry_sequence_breakers": [6]}), torch.zeros(16), 16, ctx).any()

    class PiecesTokenizer:
        pieces = ["a", "b", "\n", "c", ": ", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n"]

    s = plain(**{**DRY, "dry_sequence_breakers": [":"]})
    ctx = [5, 4, 7, 8, 9, 1, 5, 4, 7]  # token 4 is ": " -> the match "5 4 7" is cut to "7"
    assert not processed(s, torch.zeros(16), 16, ctx, tokenizer=PiecesTokenizer()).any()
    assert processed(plain(**DRY), torch.zeros(16), 16, ctx).any()

    class EncodeTokenizer:  # no per-token text: a breaker maps to the last token of its encoding
        def encode(self, text):
            return torch.tensor([[0, {":": 4}[text]]])

    assert not processed(s, torch.zeros(16), 16, ctx, tokenizer=EncodeTokenizer()).any()


@pytest.mark.slow
def test_dry_breakers_from_the_real_tokenizer():
    from tests.tiny_models import default_tokenizer

    tok = default_tokenizer()
    ids = tok.encode("one: two\nthree").reshape(-1).tolist()
    js = JobSampler(plain(dry_multiplier=1.0), 0, tok.vocab_size, tokenizer=tok)
    pieces = tok.pieces
    for i in ids:
        assert js._dry_breaker[i] == (":" in pieces[i] or "\n" in pieces[i])
    assert js._dry_breaker[list(tok.special_token_ids)].all()

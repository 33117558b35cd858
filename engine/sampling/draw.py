"""One job's draws for one step, from the logits rows the forward returned for it.

Three shapes of step, one owner: a plain step draws once from its one row; a CFG step mixes its positive
and negative sequences' log-probabilities, then draws once; a speculative step draws from each verifying
row in turn and stops at the first draw that differs from the draft that row checked. Accepting a draft
only when the job's own sampler draws it keeps greedy output unchanged and sampled output distributed as
without drafting.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from .sampler import JobSampler, SampleResult

Blocked = Callable[[int], "np.ndarray | None"]  # tokens banned at the i-th draw of this step


def draw_cfg(sampler: JobSampler, positive: torch.Tensor, negative: torch.Tensor, scale: float,
             context: Sequence[int], return_top_tokens: int, blocked: np.ndarray | None) -> list[SampleResult]:
    """Classifier-free guidance: scale * log p(positive) + (1 - scale) * log p(negative), drawn once."""
    pos, neg = (torch.log_softmax(row, dim=-1) for row in (positive, negative))
    return [sampler.sample(scale * pos + (1 - scale) * neg, context, return_top_tokens, blocked)]


def draw_verified(sampler: JobSampler, rows: Sequence[torch.Tensor], drafts: Sequence[int],
                  context: Sequence[int], return_top_tokens: int, blocked_at: Blocked) -> list[SampleResult]:
    """Draw from rows[0], then from rows[i] while the previous draw equalled drafts[i - 1]: the accepted
    drafts plus one token of the job's own (rows = len(drafts) + 1; no drafts: one plain draw)."""
    context = list(context)
    out = []
    for i, row in enumerate(rows):
        draw = sampler.sample(row, context, return_top_tokens, blocked_at(i))
        out.append(draw)
        if i >= len(drafts) or draw.token != drafts[i]:
            break
        context.append(draw.token)
    return out

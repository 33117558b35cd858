"""A step's embedding inputs: which rows of the flat batch take a job's MMEmbedding vectors, and which
runs of them attend both ways (Gemma 3); plus the chunking rule that keeps such a run in one step.

Jobs carry their embeddings (DynamicJob(embeddings=...)); the placeholder ids in their tokens say where the
vectors go. The model replaces those rows after its token lookup (engine.model.model.Model.forward).
"""
from __future__ import annotations

from typing import Any

import torch

from .embeddings import FIRST_ID
from .sequence import ScheduledSeq


def placeholder_runs(tokens: list[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of consecutive placeholder ids (>= 1e9) in tokens that overlap [lo, hi),
    extended to their full length in tokens (a run may begin before lo or end after hi)."""
    runs = []
    i = lo
    n = len(tokens)
    while i < hi:
        if tokens[i] < FIRST_ID:
            i += 1
            continue
        start = i
        while start > 0 and tokens[start - 1] >= FIRST_ID:
            start -= 1
        end = i
        while end < n and tokens[end] >= FIRST_ID:
            end += 1
        runs.append((start, end))
        i = end
    return runs


def chunk_end(tokens: list[int], start: int, end: int, last: int) -> int:
    """A prefill chunk's end, moved past a run of placeholders it would split (the run's rows must see
    each other's K/V in one step). A result >= last means the chunk runs to the prompt's end."""
    if end >= last or end <= 0 or tokens[end - 1] < FIRST_ID or tokens[end] < FIRST_ID:
        return end
    while end < len(tokens) and tokens[end] >= FIRST_ID:
        end += 1
    return end


def step_inputs(plan: list[ScheduledSeq[Any]], bidirectional: bool, device: torch.device
                ) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple]:
    """(rows, vectors, blocks) for Batch.mm_rows / mm_vectors / mm_blocks, from the plan in batch order.

    bidirectional: the model lets an image's rows attend to each other (Gemma 3): each run of placeholder
    rows in a step becomes a block (sequence, first row, end row, end position) when it has rows that
    causal attention would keep from later ones."""
    rows: list[int] = []
    vectors: list[torch.Tensor] = []
    blocks: list[tuple[int, int, int, int]] = []
    row0 = 0
    for b, e in enumerate(plan):
        lookup = e.job.embeddings
        if lookup:
            found = lookup.vectors(e.tokens)
            if found is not None:
                offsets, vecs = found
                rows += [row0 + i for i in offsets]
                vectors.append(vecs)
                if bidirectional:
                    for s, t in placeholder_runs(e.seq.tokens, e.start, min(e.end, len(e.seq.tokens))):
                        first = max(s, e.start)
                        if t - first > 1:
                            if t > e.end:
                                raise RuntimeError("a prefill chunk ends inside an image's run of embedding rows")
                            blocks.append((b, row0 + first - e.start, row0 + t - e.start, t))
        row0 += len(e.tokens)
    if not rows:
        return None, None, ()
    return (torch.tensor(rows, dtype=torch.long, device=device), torch.cat(vectors).to(device), tuple(blocks))


def no_placeholders(drafts: list[int]) -> list[int]:
    """N-gram drafts cut before the first placeholder id (a reply never samples one, so it would only be
    rejected)."""
    for i, t in enumerate(drafts):
        if t >= FIRST_ID:
            return drafts[:i]
    return drafts

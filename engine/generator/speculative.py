"""The draft-model proposer for speculative decoding (the n-gram one is ngram.py).

The main model verifies a job's k drafts in one forward; a draft is accepted while the token the job's
sampler draws equals it, so greedy output is unchanged and sampled output keeps the job's distribution.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..model.batch import Batch

if TYPE_CHECKING:
    from ..cache.paged_cache import PagedCache
    from ..cache.pagetable import PageTable
    from ..model.model import Model
    from .sequence import Sequence


class ModelDrafter:
    """Greedy drafts from a small model whose cache shares the main page table's layout."""

    def __init__(self, model: "Model", cache: "PagedCache", pagetable: "PageTable"):
        self.model = model
        self.cache = cache
        self.pagetable = pagetable

    def prefill(self, entries: list[tuple["Sequence", list[int], int]]) -> None:
        """Write the draft model's K/V for prompt chunks the main model processes this step, from wherever the
        draft cache stops (cached pages written without the draft model lack its K/V)."""
        if not entries:
            return
        seqs = []
        for seq, toks, start in entries:
            begin, end = min(seq.draft_kv_len, start), start + len(toks)
            seqs.append((seq.tokens[begin:end], begin, seq.page_ids(end, self.pagetable)))
        batch = Batch.build(seqs, self.pagetable.page_size, [0] * len(entries), self.model.device)
        self.model.forward(batch, self.cache)
        for seq, toks, start in entries:
            seq.wrote_draft_kv(start + len(toks))

    def draft(self, wants: list[tuple["Sequence", int]]) -> list[list[int]]:
        """k greedy draft tokens for each (sequence, k), batched over sequences, one draft forward per position."""
        drafts: list[list[int]] = [[] for _ in wants]
        for step in range(max((k for _, k in wants), default=0)):
            rows = [(i, seq) for i, (seq, k) in enumerate(wants) if k > step]
            seqs = []
            for i, seq in rows:
                tokens = seq.tokens
                if step == 0:  # catch up on real tokens the draft cache hasn't seen (1 or 2 usually)
                    start = min(seq.draft_kv_len, len(tokens) - 1)
                    toks = tokens[start:]
                else:
                    start = len(tokens) - 1 + step
                    toks = drafts[i][-1:]
                seqs.append((toks, start, seq.page_ids(start + len(toks), self.pagetable)))
            batch = Batch.build(seqs, self.pagetable.page_size, None, self.model.device)
            logits = self.model.forward(batch, self.cache)[:, : self.model.vocab_size]
            best = logits.argmax(dim=-1).tolist()
            for (i, seq), tok in zip(rows, best):
                drafts[i].append(tok)
                if step == 0:
                    seq.wrote_draft_kv(len(seq.tokens))
        return drafts


def check_draft_model(model: "Model", cache: "PagedCache", draft_model: "Model", draft_cache: "PagedCache") -> None:
    """The draft must speak the main model's vocabulary and mirror its cache's page layout."""
    if draft_cache is None:
        raise ValueError("draft_model needs a draft_cache (PagedCache(draft_model, same max_tokens, same page_size))")
    draft_cache.spec.check_serves(draft_model.cache_spec(), "draft_cache")
    if draft_model.vocab_size != model.vocab_size:
        raise ValueError(f"draft model vocabulary ({draft_model.vocab_size}) differs from the main model's "
                         f"({model.vocab_size})")
    if (draft_cache.num_pages, draft_cache.page_size) != (cache.num_pages, cache.page_size):
        raise ValueError("draft_cache must have the same number of pages and page size as the main cache")


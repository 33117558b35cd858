"""`Sequence`: one row a job feeds the model (its tokens, pages and K/V progress), and `ScheduledSeq`,
the share of one step the scheduler gives it.

Sequence methods are the only writers of tokens, kv_len and draft_kv_len, so the rules about them (a
rewind drops the K/V of removed tokens; the draft model's cache never claims tokens the main cache lost)
live in one place instead of in the generator, the job and the drafter.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from ..cache.pagetable import CachePage, PageTable

Owner = TypeVar("Owner")  # what a scheduled sequence belongs to: the generator's job


@dataclass(eq=False)
class Sequence:
    """Tokens (prompt + generated) and the pages holding their K/V. Read the fields; change them only
    through the methods."""

    tokens: list[int]
    prompt_len: int
    pages: list[CachePage] = field(default_factory=list)
    _kv_len: int = 0
    _draft_kv_len: int = 0
    _fill_len: int | None = None  # tokens fed as a prompt before decoding: the prompt, or all on a resume

    @property
    def fill_len(self) -> int:
        """Tokens fed in prefill chunks before decoding starts: the prompt; after a preemption, every token so
        far (the K/V the prefix cache lost meanwhile is recomputed as if it were a prompt)."""
        return self.prompt_len if self._fill_len is None else min(self._fill_len, len(self.tokens))

    @property
    def kv_len(self) -> int:
        """Tokens whose K/V is in the cache."""
        return self._kv_len

    @property
    def draft_kv_len(self) -> int:
        """Tokens whose K/V the draft model's cache holds (speculative decoding with a draft model)."""
        return self._draft_kv_len

    def attach(self, pages: list[CachePage], cached_tokens: int, draft_tokens: int = 0) -> None:
        """Take the pages allocated for this sequence; the first cached_tokens already hold K/V, and the first
        draft_tokens the draft model's K/V too (the draft cache mirrors the main one's pages, but cached pages
        written without the draft model lack its K/V)."""
        self.pages = pages
        self._kv_len = cached_tokens
        self._draft_kv_len = min(draft_tokens, cached_tokens)

    def detach(self) -> list[CachePage]:
        """Give up the pages (preemption): no K/V is held any more; the tokens stay, and a later attach with
        resume=True feeds them all again from wherever the prefix cache still holds them."""
        pages, self.pages = self.pages, []
        self._kv_len = self._draft_kv_len = 0
        return pages

    def resume(self, pages: list[CachePage], cached_tokens: int, draft_tokens: int = 0) -> None:
        """Attach pages after a preemption: tokens[:cached_tokens] are found in the cache, the rest is refed."""
        self.attach(pages, cached_tokens, draft_tokens)
        self._fill_len = len(self.tokens)

    def pop_prompt_token(self) -> int:
        """Remove the prompt's last token (token healing regenerates it), before any K/V exists."""
        self.prompt_len -= 1
        return self.tokens.pop()

    def append(self, token: int) -> None:
        self.tokens.append(token)

    def wrote_kv(self, kv_len: int) -> None:
        """After a forward: the cache holds valid K/V for tokens[:kv_len] (rejected drafts excluded)."""
        self._kv_len = kv_len

    def wrote_draft_kv(self, kv_len: int) -> None:
        """The draft model's cache holds valid K/V for tokens[:kv_len]."""
        self._draft_kv_len = kv_len

    def page_ids(self, length: int, table: PageTable) -> list[int]:
        """Indices of the pages that hold tokens[:length]: this sequence's block table for a forward (the main
        model's and the draft model's alike, as the draft cache mirrors the main one's pages)."""
        return [p.index for p in self.pages[: table.pages_needed(length)]]

    def rewind(self, n: int) -> None:
        """Drop the last n tokens; K/V past the new end (and the last token's, fed again) no longer counts."""
        del self.tokens[len(self.tokens) - n :]
        self._kv_len = min(self._kv_len, len(self.tokens) - 1)
        self._draft_kv_len = min(self._draft_kv_len, self._kv_len)


@dataclass(frozen=True, eq=False)
class ScheduledSeq(Generic[Owner]):
    """One sequence's share of a step: `tokens` fed from position `start`; logits wanted for the last `rows`
    of them (several when they verify `drafts`). Batch.build keeps the plan's order, so the i-th record's
    logits start at batch.logit_offsets[i]. `job` is the owner the scheduler groups records by (a
    DynamicJob); this layer never looks into it, so it sits below the job."""

    job: Owner
    seq: Sequence
    tokens: list[int]
    start: int
    rows: int
    drafts: tuple[int, ...] = ()
    prefill: bool = False

    @property
    def end(self) -> int:
        """Sequence length once this step's tokens are in."""
        return self.start + len(self.tokens)

    @property
    def prompt_rows(self) -> int:
        """How many of the fed tokens are prompt tokens, by position: a prompt token takes the prompt rows' path
        whether it comes in a prefill chunk or alone (a prompt found in the cache but for its last token feeds
        that token as a decode step does), so its K/V are the bits a fresh prefill gives. A resumed job's refill
        feeds its reply too, whose rows take the model's path for generated rows (as when first decoded)."""
        return max(0, min(len(self.tokens), self.seq.prompt_len - self.start))

"""Invariants of a PageTable and the sequences using it, checked from the outside (tests only).

A page's name (phash) and its `prev_hash` label must be the chained hash of its own tokens from the root
through its real predecessors; dedup and partial-page reuse trust those names, so a wrong one silently hands
a sequence K/V of other positions. FakeKV stands in for the K/V pools: each slot records what a real K/V
vector depends on (the chained hash of the page's predecessors, the slot, the page's tokens up to it), so a
page holding another position's K/V is caught even when its token ids look right.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from engine.cache.pagetable import CachePage, PageTable, chain_hash


def prefix_hashes(root: bytes, tokens: list[int], page_size: int, n_pages: int) -> list[bytes]:
    """out[i] = chained hash of the i full pages before page i (out[0] = root)."""
    out = [root]
    for i in range(n_pages - 1):
        out.append(chain_hash(out[-1], tokens[i * page_size : (i + 1) * page_size]))
    return out


@dataclass
class Live:
    """One live sequence: its owner serial, block table, tokens, how many are recorded, and its root."""

    owner: int
    pages: list[CachePage]
    tokens: list[int]
    recorded: int  # tokens[:recorded] were passed to PageTable.written
    root: bytes


class FakeKV:
    """slot -> (hash of the page's predecessors, offset, page tokens up to the slot): what real K/V depends on.

    `valid` names the page field saying how many slots hold K/V: kv_position for the main cache,
    draft_position for the draft model's mirrored cache (copied and permuted alongside)."""

    def __init__(self, table: PageTable, valid: str = "kv_position", mirror: "FakeKV | None" = None):
        self.table = table
        self.valid = valid
        self.slots: dict[tuple[int, int], tuple] = {}
        self.mirror = mirror
        table.copy_fn = self.copy

    def copy(self, src: int, dst: int, n: int) -> None:
        for i in range(n):
            self.slots[(dst, i)] = self.slots.get((src, i))
        if self.mirror is not None:
            self.mirror.copy(src, dst, n)

    def permute(self, new_order: list[int]) -> None:
        self.slots = {(k, i): self.slots[(old, i)] for k, old in enumerate(new_order)
                      for i in range(self.table.page_size) if (old, i) in self.slots}
        if self.mirror is not None:
            self.mirror.permute(new_order)

    def write(self, pages: list[CachePage], tokens: list[int], start: int, end: int, root: bytes) -> None:
        """The model ran tokens[start:end] of this sequence (tokens may run past what is recorded: drafts)."""
        ps = self.table.page_size
        prev = prefix_hashes(root, tokens, ps, (end - 1) // ps + 1)
        for pos in range(start, end):
            i, off = divmod(pos, ps)
            self.slots[(pages[i].index, off)] = (prev[i], off, tuple(tokens[i * ps : pos + 1]))

    def check(self, pages: list[CachePage], tokens: list[int], n: int, root: bytes) -> None:
        """The cache really holds this sequence's K/V for tokens[:n]."""
        if n <= 0:
            return
        ps = self.table.page_size
        prev = prefix_hashes(root, tokens, ps, (n - 1) // ps + 1)
        for pos in range(n):
            i, off = divmod(pos, ps)
            want = (prev[i], off, tuple(tokens[i * ps : pos + 1]))
            assert self.slots.get((pages[i].index, off)) == want, f"wrong K/V at position {pos} (page {pages[i].index})"

    def check_labels(self) -> None:
        """Every written slot of every page matches the page's own labels (prev_hash, tokens)."""
        for p in self.table.pages:
            for off in range(getattr(p, self.valid)):
                want = (p.prev_hash, off, tuple(p.tokens[: off + 1]))
                assert self.slots.get((p.index, off)) == want, f"page {p.index} slot {off} is not what its labels say"


def check_table(table: PageTable, live: list[Live]) -> None:
    """Structural invariants of the table and of every live sequence's block table."""
    ps = table.page_size
    for h, p in table.by_hash.items():
        assert p.phash == h, f"by_hash names page {p.index} under a hash it does not carry"
    for p in table.pages:
        assert 0 <= p.draft_position <= p.kv_position <= len(p.tokens) <= ps, f"page {p.index}: {p}"
        if p.phash is not None:  # named pages are full (or prompt pages about to be filled), named by content
            assert len(p.tokens) == ps and p.prev_hash is not None, f"page {p.index} is named but not full"
            assert chain_hash(p.prev_hash, p.tokens) == p.phash, f"page {p.index}'s hash is not its tokens' hash"
        if p.ref_count == 0:
            assert not p.owners
            if p.kv_position == 0:
                assert p.phash is None and p.prev_hash is None and not p.tokens, f"free page {p.index} keeps labels"
            if p.phash is not None:
                assert p.kv_position == ps, f"cached page {p.index} is named but not fully written"
    uses: Counter[int] = Counter()
    owners: dict[int, Counter] = {}
    for seq in live:
        indices = [p.index for p in seq.pages]
        assert len(indices) == len(set(indices)), f"owner {seq.owner}: a physical page twice in {indices}"
        prev = prefix_hashes(seq.root, seq.tokens, ps, len(seq.pages))
        for i, p in enumerate(seq.pages):
            uses[p.index] += 1
            owners.setdefault(p.index, Counter())[seq.owner] += 1
            start = i * ps
            known = min(p.kv_position, max(len(seq.tokens) - start, 0))
            assert p.tokens[:known] == seq.tokens[start : start + known], f"owner {seq.owner} page {i}: other tokens"
            if start < seq.recorded or p.phash is not None:
                assert p.prev_hash == prev[i], f"owner {seq.owner} page {i} (#{p.index}): prev_hash is not its predecessor's"
            if start + ps <= seq.recorded:
                assert p.kv_position == ps and p.phash == chain_hash(prev[i], seq.tokens[start : start + ps]), \
                    f"owner {seq.owner} page {i} (#{p.index}) is full but not named by its chained hash"
    for p in table.pages:
        assert p.ref_count == uses[p.index] == len(p.owners), f"page {p.index}: refs {p.ref_count}, uses {uses[p.index]}"
        assert Counter(p.owners) == owners.get(p.index, Counter()), f"page {p.index}: owners {p.owners}"
        if len(owners.get(p.index, ())) > 1:
            assert p.phash is not None, f"page {p.index} is shared by several sequences without a hash"


def check_released(table: PageTable) -> None:
    """Nothing is referenced once every sequence has been released."""
    assert all(p.ref_count == 0 and not p.owners for p in table.pages), "page leak"
    check_table(table, [])


def live_sequences(gen) -> list[Live]:
    """The live sequences of a DynamicGenerator, for check_table."""
    return [Live(job.serial, seq.pages, seq.tokens, min(seq.kv_len, job.stable_len(seq)), gen.root)
            for job in gen.active for seq in job.seqs]

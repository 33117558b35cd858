"""Page table behaviour and invariants, without a model (K/V content is tracked symbolically)."""
from __future__ import annotations

import random

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.cache.pagetable import CACHED, FREE, PageTable, chain_hash, root_hash

PS = 16
ROOT = root_hash(None)


class FakeKV:
    """Stands in for the K/V pools: slot -> token id written there, so reuse can be checked for truth."""

    def __init__(self, table: PageTable):
        self.table = table
        self.slots: dict[tuple[int, int], int] = {}
        table.copy_fn = self.copy

    def copy(self, src: int, dst: int, n: int) -> None:
        for i in range(n):
            self.slots[(dst, i)] = self.slots[(src, i)]

    def write(self, pages, tokens, start, end):
        for pos in range(start, end):
            self.slots[(pages[pos // PS].index, pos % PS)] = tokens[pos]

    def check(self, pages, tokens, n):
        """The cache really holds tokens[:n] for this sequence."""
        for pos in range(n):
            assert self.slots.get((pages[pos // PS].index, pos % PS)) == tokens[pos], f"wrong K/V at position {pos}"


def run_sequence(table, kv, tokens, new, owner, root=ROOT):
    alloc = table.allocate(tokens, len(tokens) + new, root, owner)
    kv.check(alloc.pages, tokens, alloc.cached_tokens)
    seq = list(tokens)
    kv.write(alloc.pages, seq, alloc.cached_tokens, len(seq))
    table.written(alloc.pages, seq, len(seq))
    for _ in range(new):
        seq.append(random.randrange(1000))
        kv.write(alloc.pages, seq, len(seq) - 1, len(seq))
        table.written(alloc.pages, seq, len(seq))
    return alloc, seq


def test_chain_hash_depends_on_prefix_and_root():
    a = chain_hash(ROOT, list(range(PS)))
    assert a == chain_hash(ROOT, list(range(PS)))
    assert a != chain_hash(root_hash(("lora", 1.0)), list(range(PS)))
    assert chain_hash(a, [1] * PS) != chain_hash(ROOT, [1] * PS)


def test_page_size_must_be_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        PageTable(8, 24)


def test_prefix_pages_are_shared_then_cached_then_revived():
    table = PageTable(16, PS)
    kv = FakeKV(table)
    prompt = list(range(3 * PS + 5))
    a1, _ = run_sequence(table, kv, prompt, 4, owner=1)
    a2 = table.allocate(prompt, len(prompt) + 4, ROOT, owner=2)
    # Three full prompt pages are shared while both live.
    assert [p.index for p in a2.pages[:3]] == [p.index for p in a1.pages[:3]]
    assert all(p.ref_count == 2 for p in a2.pages[:3])
    assert a2.cached_tokens >= 3 * PS
    kv.check(a2.pages, prompt, a2.cached_tokens)
    table.release(a1.pages, 1)
    table.release(a2.pages, 2)
    states, _ = table.states()
    assert FREE in states and CACHED in states and all(s < 0 for s in states)
    # A third request finds the prompt in the cache although nobody references it.
    a3 = table.allocate(prompt, len(prompt) + 4, ROOT, owner=3)
    assert a3.cached_tokens == len(prompt) - 1  # everything but the token that must produce logits
    kv.check(a3.pages, prompt, a3.cached_tokens)


def test_lora_identity_separates_caches():
    table = PageTable(16, PS)
    kv = FakeKV(table)
    prompt = list(range(2 * PS + 3))
    a1, _ = run_sequence(table, kv, prompt, 1, owner=1)
    table.release(a1.pages, 1)
    other = table.allocate(prompt, len(prompt) + 1, root_hash(("adapter-a", 1.0)), owner=2)
    assert other.cached_tokens == 0


def test_generated_full_pages_are_hashed_and_deduplicated():
    table = PageTable(32, PS)
    kv = FakeKV(table)
    random.seed(0)
    prompt = list(range(5))
    a1, seq1 = run_sequence(table, kv, prompt, 2 * PS, owner=1)
    full = [p for p in a1.pages if p.kv_position == PS]
    assert full and all(p.phash is not None for p in full)
    # A second sequence that writes the same tokens ends up on the same physical pages.
    a2 = table.allocate(prompt, len(prompt) + 2 * PS, ROOT, owner=2)
    kv.check(a2.pages, prompt, a2.cached_tokens)
    seq2 = list(prompt)
    kv.write(a2.pages, seq2, a2.cached_tokens, len(seq2))
    for tok in seq1[len(prompt):]:
        seq2.append(tok)
        kv.write(a2.pages, seq2, len(seq2) - 1, len(seq2))
        table.written(a2.pages, seq2, len(seq2))
    assert a2.pages[0] is a1.pages[0]
    assert a2.pages[0].ref_count == 2
    kv.check(a2.pages, seq2, len(seq2))


def test_partial_page_prefix_is_copied():
    table = PageTable(16, PS)
    kv = FakeKV(table)
    prompt = list(range(PS + 10))
    a1, seq = run_sequence(table, kv, prompt, 0, owner=1)
    table.release(a1.pages, 1)
    # Same first 16 + 7 tokens, then different: 7 tokens of the second page come from the old partial page.
    prompt2 = prompt[: PS + 7] + [999, 998, 997]
    a2 = table.allocate(prompt2, len(prompt2) + 2, ROOT, owner=2)
    assert a2.cached_tokens == PS + 7
    kv.check(a2.pages, prompt2, a2.cached_tokens)


def test_lru_evicts_least_recently_used_cached_page():
    table = PageTable(4, PS)
    kv = FakeKV(table)
    old = [1] * PS + [2]
    new = [3] * PS + [4]
    a, _ = run_sequence(table, kv, old, 0, 1)
    table.release(a.pages, 1)
    b, _ = run_sequence(table, kv, new, 0, 2)
    table.release(b.pages, 2)
    # Two of the four cached pages must be recycled: the older prompt's go first.
    c = table.allocate([7] * (PS + 1), 2 * PS, ROOT, owner=3)
    assert set(c.pages) == set(a.pages)
    table.release(c.pages, 3)
    d = table.allocate(new, len(new), ROOT, owner=4)
    assert d.cached_tokens == PS
    table.release(d.pages, 4)


def test_cannot_allocate_beyond_capacity():
    table = PageTable(2, PS)
    assert not table.can_allocate([1] * 10, 3 * PS, ROOT)
    with pytest.raises(MemoryError):
        table.allocate([1] * 10, 3 * PS, ROOT, 1)
    assert all(p.ref_count == 0 for p in table.pages)


def test_defrag_lays_chains_out_in_order():
    table = PageTable(12, PS)
    kv = FakeKV(table)
    random.seed(1)
    allocs = []
    for owner in range(4):
        a, _ = run_sequence(table, kv, [owner] * (PS * 2 + 1), 0, owner)
        allocs.append(a)
    for owner in (0, 2):
        table.release(allocs[owner].pages, owner)
    assert table.defrag_order() is None  # pages are referenced: no defrag
    for owner in (1, 3):
        table.release(allocs[owner].pages, owner)
    order = table.defrag_order()
    if order is not None:
        assert sorted(order) == list(range(12))
        table.apply_order(order)
        written = [p.kv_position > 0 for p in table.pages]
        assert written == sorted(written, reverse=True)  # content first, empty pages at the end


class PageTableMachine(RuleBasedStateMachine):
    """Random allocate / grow / finish / cancel sequences keep the page table's invariants."""

    def __init__(self):
        super().__init__()
        self.table = PageTable(24, PS)
        self.kv = FakeKV(self.table)
        self.live: dict[int, tuple] = {}
        self.next_owner = 0
        self.prefixes = [[random.Random(i).randrange(50) for _ in range(PS * 3)] for i in range(3)]

    @rule(prefix=st.integers(0, 2), cut=st.integers(1, 3 * PS), tail=st.lists(st.integers(0, 49), max_size=20),
          new=st.integers(0, 2 * PS))
    def allocate(self, prefix, cut, tail, new):
        tokens = self.prefixes[prefix][:cut] + tail
        total = len(tokens) + new
        if not self.table.can_allocate(tokens, total, ROOT):
            with pytest.raises(MemoryError):
                self.table.allocate(tokens, total, ROOT, self.next_owner)
            return
        alloc = self.table.allocate(tokens, total, ROOT, self.next_owner)
        self.kv.check(alloc.pages, tokens, alloc.cached_tokens)
        self.kv.write(alloc.pages, tokens, alloc.cached_tokens, len(tokens))
        self.table.written(alloc.pages, tokens, len(tokens))
        self.live[self.next_owner] = (alloc.pages, list(tokens), total)
        self.next_owner += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data(), steps=st.integers(1, PS + 3))
    def grow(self, data, steps):
        owner = data.draw(st.sampled_from(sorted(self.live)))
        pages, tokens, total = self.live[owner]
        for _ in range(min(steps, total - len(tokens))):
            tokens.append(data.draw(st.integers(0, 49)))
            self.kv.write(pages, tokens, len(tokens) - 1, len(tokens))
            self.table.written(pages, tokens, len(tokens))
        self.kv.check(pages, tokens, len(tokens))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish_or_cancel(self, data):
        owner = data.draw(st.sampled_from(sorted(self.live)))
        pages, _, _ = self.live.pop(owner)
        self.table.release(pages, owner)

    @invariant()
    def refcounts_match_live_users(self):
        users: dict[int, int] = {}
        for pages, _, _ in self.live.values():
            for p in pages:
                users[p.index] = users.get(p.index, 0) + 1
        for p in self.table.pages:
            assert p.ref_count == users.get(p.index, 0) == len(p.owners)

    @invariant()
    def shared_pages_are_shared_by_hash(self):
        seen: dict[int, int] = {}
        for owner, (pages, _, _) in self.live.items():
            for p in pages:
                if p.index in seen and seen[p.index] != owner:
                    assert p.phash is not None and self.table.by_hash.get(p.phash) is p
                seen[p.index] = owner

    @invariant()
    def live_sequences_hold_their_tokens(self):
        for pages, tokens, _ in self.live.values():
            self.kv.check(pages, tokens, len(tokens))

    def teardown(self):
        for owner, (pages, _, _) in list(self.live.items()):
            self.table.release(pages, owner)
        assert all(p.ref_count == 0 and not p.owners for p in self.table.pages), "page leak"
        states, _ = self.table.states()
        assert all(s in (FREE, CACHED) for s in states)


TestPageTableMachine = PageTableMachine.TestCase
TestPageTableMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)

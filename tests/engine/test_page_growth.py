"""Pages on demand in the page table: sequences start with their prompt's pages, grow page by page as they
write, and when the pool runs dry the newest gives every page back (preemption) and later resumes from what
the prefix cache still holds. Checked against a model of the pool (K/V content tracked symbolically)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import invariant, precondition, rule

import tests.engine.test_pagetable as base
from engine.cache.pagetable import PageTable
from tests.engine.pagetable_checks import FakeKV, check_released

PS = base.PS
ROOT = base.ROOT


def snapshot(table):
    return [(p.index, p.ref_count, list(p.owners), p.phash, p.prev_hash, list(p.tokens), p.kv_position)
            for p in table.pages]


def test_grow_appends_pages_chained_from_the_last_one():
    table = PageTable(8, PS)
    kv = FakeKV(table)
    prompt = list(range(PS + 3))
    alloc = table.allocate(prompt, len(prompt) + 1, ROOT, owner=1)
    assert len(alloc.pages) == 2  # the prompt and the next token's slot: nothing for the reply yet
    seq = list(prompt)
    kv.write(alloc.pages, seq, 0, len(seq), ROOT)
    table.written(alloc.pages, seq, len(seq))
    for t in range(3 * PS):  # decode, taking a page whenever the next token needs one
        assert table.grow(alloc.pages, len(seq) + 1, ROOT, owner=1)
        seq.append(t % 7)
        kv.write(alloc.pages, seq, len(seq) - 1, len(seq), ROOT)
        table.written(alloc.pages, seq, len(seq))
    assert len(alloc.pages) == table.pages_needed(len(seq))
    base.check_table(table, [base.Live(1, alloc.pages, seq, len(seq), ROOT)])
    kv.check(alloc.pages, seq, len(seq), ROOT)
    table.release(alloc.pages, 1)
    again = table.allocate(seq, len(seq) + 1, ROOT, owner=2)  # resumed: every full page found by hash
    assert again.cached_tokens == len(seq) - 1
    kv.check(again.pages, seq, again.cached_tokens, ROOT)
    table.release(again.pages, 2)
    check_released(table)


def test_grow_refused_changes_nothing():
    table = PageTable(3, PS)
    a = table.allocate(list(range(2 * PS)), 2 * PS, ROOT, owner=1)
    b = table.allocate([1], 2, ROOT, owner=2)
    before = snapshot(table)
    assert not table.grow(a.pages, 2 * PS + 1, ROOT, owner=1)  # the third page is b's: refused
    assert snapshot(table) == before and len(a.pages) == 2
    table.release(b.pages, 2)
    assert table.grow(a.pages, 2 * PS + 1, ROOT, owner=1) and len(a.pages) == 3
    table.release(a.pages, 1)
    check_released(table)


class GrowthMachine(base.GenerationMachine):
    """The generator's page traffic with pages on demand: admission takes the prompt's pages and one slot,
    every write first grows the sequence, and a pool that can't give a page preempts the newest sequence
    (owner numbers rank like the generator's serials); preempted sequences resume or are cancelled."""

    def __init__(self):
        super().__init__()
        self.table = PageTable(10, PS)  # small: growth often runs the pool dry
        self.draft_kv = FakeKV(self.table, "draft_position")
        self.kv = FakeKV(self.table, mirror=self.draft_kv)
        self.preempted: dict[int, base.Seq] = {}
        self.preemptions = self.resumes = 0

    def _admission_len(self, prompt, program):
        return len(prompt) + 1

    def _room(self, s, n):
        while True:
            before = snapshot(self.table)
            free = self.table.num_unreferenced()
            short = self.table.pages_needed(n) - len(s.pages)
            held, awaited = list(s.pages), self._awaited_cached()
            if self.table.grow(s.pages, n, s.root, s.owner):
                self._check_recycling([p for p in s.pages if p not in held], awaited)
                assert len(s.pages) == max(self.table.pages_needed(n), len(s.pages))
                assert self.table.num_unreferenced() == free - max(short, 0)
                return True
            assert short > free and snapshot(self.table) == before  # refused: nothing changed
            victim = self.live[max(self.live)]  # the newest sequence gives its pages back
            self._preempt(victim)
            if victim is s:
                return False

    def _awaited_cached(self):
        return {i for i in self.table.awaited if self.table.pages[i].kv_position and not self.table.pages[i].ref_count}

    def _check_recycling(self, taken, awaited):
        """Pages a queued sequence will resume from are taken only when no other unreferenced page is left."""
        if any(p.index in awaited for p in taken):
            assert all(p.index in awaited for p in self.table.pages if p.ref_count == 0)

    def _preempt(self, s):
        del self.live[s.owner]
        self._record(s)
        s.stable = max(s.stable, s.recorded)
        self.table.release(s.pages, s.owner)
        s.kept = [p for p in s.pages if p.ref_count == 0 and p.kv_position]
        s.pages = []
        self.preempted[s.owner] = s
        self._await()
        self.preemptions += 1

    @precondition(lambda self: self.preempted)
    @rule(data=st.data())
    def resume(self, data):
        """Admitted again: the cache still holds some of its K/V (by hash, or a partial page's prefix)."""
        s = self.preempted[data.draw(st.sampled_from(sorted(self.preempted)))]
        lookup, n = s.tokens[: s.stable], len(s.tokens) + 1
        if not self.table.can_allocate(lookup, n, s.root):
            before = snapshot(self.table)
            with pytest.raises(MemoryError):
                self.table.allocate(lookup, n, s.root, s.owner)
            assert snapshot(self.table) == before
            return
        free, cost = self.table.num_unreferenced(), self.table.pages_to_allocate([(lookup, n)], s.root)
        awaited = self._awaited_cached()
        hits = {self.table.by_hash[h].index for h in self.table.prompt_hashes(lookup, s.root) if h in self.table.by_hash}
        alloc = self.table.allocate(lookup, n, s.root, s.owner)
        self._check_recycling([p for p in alloc.pages if p.index not in hits], awaited)  # the pages taken fresh
        assert self.table.num_unreferenced() == free - cost
        assert alloc.cached_tokens <= max(s.stable - 1, 0) and alloc.draft_tokens <= alloc.cached_tokens
        self.kv.check(alloc.pages, s.tokens, alloc.cached_tokens, s.root)
        self.draft_kv.check(alloc.pages, s.tokens, alloc.draft_tokens, s.root)
        s.pages, s.kv_len, s.recorded = alloc.pages, alloc.cached_tokens, alloc.cached_tokens
        s.draft_len = alloc.draft_tokens
        s._fill = len(s.tokens)  # everything so far is fed again from where the cache stops
        del self.preempted[s.owner]
        self.live[s.owner] = s
        self.resumes += 1
        self._await()

    @precondition(lambda self: self.preempted)
    @rule(data=st.data())
    def cancel_preempted(self, data):
        del self.preempted[data.draw(st.sampled_from(sorted(self.preempted)))]
        self._await()

    def _await(self):
        """As the generator tells the table (PageGrowth.await_resumes): the cached pages queued sequences left."""
        self.table.awaited = {p.index for s in self.preempted.values() for p in s.kept
                              if p.ref_count == 0 and p.kv_position}

    @invariant()
    def pool_matches_its_model(self):
        """Free (unreferenced) pages are exactly those no live sequence lists; a preempted one holds none."""
        held = [p.index for s in self.live.values() for p in s.pages]
        assert self.table.num_unreferenced() == self.table.num_pages - len(set(held))
        for p in self.table.pages:
            assert not set(p.owners) & set(self.preempted), f"page {p.index} still held by a preempted sequence"


TestGrowthMachine = GrowthMachine.TestCase
TestGrowthMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None, derandomize=True,
                                      database=None, suppress_health_check=[HealthCheck.filter_too_much])

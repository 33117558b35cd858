"""Page table behaviour and invariants, without a model (K/V content is tracked symbolically)."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.cache.pagetable import CACHED, FREE, PageTable, chain_hash, root_hash
from tests.engine.pagetable_checks import FakeKV, Live, check_released, check_table

PS = 16
ROOT = root_hash(None)


def run_sequence(table, kv, tokens, new, owner, root=ROOT, gen=None):
    """Prefill `tokens`, then generate `new` tokens (random, or the list `gen`), as the generator records them."""
    alloc = table.allocate(tokens, len(tokens) + new, root, owner)
    kv.check(alloc.pages, tokens, alloc.cached_tokens, root)
    seq = list(tokens)
    kv.write(alloc.pages, seq, alloc.cached_tokens, len(seq), root)
    table.written(alloc.pages, seq, len(seq))
    for i in range(new):
        seq.append(gen[i] if gen is not None else random.randrange(1000))
        kv.write(alloc.pages, seq, len(seq) - 1, len(seq), root)
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
    kv.check(a2.pages, prompt, a2.cached_tokens, ROOT)
    table.release(a1.pages, 1)
    table.release(a2.pages, 2)
    states, _ = table.states()
    assert FREE in states and CACHED in states and all(s < 0 for s in states)
    # A third request finds the prompt in the cache although nobody references it.
    a3 = table.allocate(prompt, len(prompt) + 4, ROOT, owner=3)
    assert a3.cached_tokens == len(prompt) - 1  # everything but the token that must produce logits
    kv.check(a3.pages, prompt, a3.cached_tokens, ROOT)


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
    kv.check(a2.pages, prompt, a2.cached_tokens, ROOT)
    seq2 = list(prompt)
    kv.write(a2.pages, seq2, a2.cached_tokens, len(seq2), ROOT)
    for tok in seq1[len(prompt):]:
        seq2.append(tok)
        kv.write(a2.pages, seq2, len(seq2) - 1, len(seq2), ROOT)
        table.written(a2.pages, seq2, len(seq2))
    assert a2.pages[0] is a1.pages[0]
    assert a2.pages[0].ref_count == 2
    kv.check(a2.pages, seq2, len(seq2), ROOT)


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
    kv.check(a2.pages, prompt2, a2.cached_tokens, ROOT)


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


def test_recycling_takes_a_released_chain_from_its_tail():
    # A prefix is only of use from its first page on: evicting the first page of a released chain would waste
    # every page after it, so its tail goes first and what is left is still a prefix (vLLM's order).
    table = PageTable(6, PS)
    kv = FakeKV(table)
    prompt = list(range(100, 100 + 4 * PS))
    a, _ = run_sequence(table, kv, prompt, 0, 1)
    table.release(a.pages, 1)
    b = table.allocate([7] * 3 * PS, 4 * PS, ROOT, owner=2)  # the 2 empty pages, then 2 of the cached four
    assert set(b.pages) & set(a.pages) == set(a.pages[2:])
    table.release(b.pages, 2)
    c = table.allocate(prompt, len(prompt), ROOT, owner=3)
    assert c.cached_tokens == 2 * PS
    kv.check(c.pages, prompt, c.cached_tokens, ROOT)


def test_recycling_takes_the_chain_released_longest_ago_first():
    table = PageTable(4, PS)
    kv = FakeKV(table)
    first, second = [1] * PS + [2] * PS, [3] * PS + [4] * PS
    a, _ = run_sequence(table, kv, first, 0, 1)
    b, _ = run_sequence(table, kv, second, 0, 2)
    table.release(b.pages, 2)  # allocated after a, released before it: least recently used
    table.release(a.pages, 1)
    c = table.allocate([9] * (PS + 1), 2 * PS, ROOT, owner=3)
    assert set(c.pages) == set(b.pages)
    table.release(c.pages, 3)
    assert table.allocate(first + [5], len(first) + 1, ROOT, owner=4).cached_tokens == 2 * PS


def test_pages_a_queued_job_awaits_are_recycled_after_every_other_cached_page():
    # A preempted job is certain to want its pages back; a finished reply's only may be. So its pages go last,
    # even when they were released longer ago, and a defragmentation keeps them marked.
    table = PageTable(4, PS)
    kv = FakeKV(table)
    waiting, done = [1] * PS + [2] * PS, [3] * PS + [4] * PS
    a, _ = run_sequence(table, kv, waiting, 0, 1)
    table.release(a.pages, 1)  # preempted: released first, least recently used
    b, _ = run_sequence(table, kv, done, 0, 2)
    table.release(b.pages, 2)
    table.awaited = {p.index for p in a.pages}
    table.apply_order([3, 2, 1, 0])
    assert table.awaited == {p.index for p in a.pages}
    c = table.allocate([9] * (PS + 1), 2 * PS, ROOT, owner=3)
    assert set(c.pages) == set(b.pages)
    table.release(c.pages, 3)
    assert table.allocate(waiting + [5], len(waiting) + 1, ROOT, owner=4).cached_tokens == 2 * PS


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


# ---------------------------------------------------------------- pages completed during generation

def test_generated_pages_chain_from_their_own_predecessor():
    """A re-run whose generated pages repeat must map each to the page of its own position, never one twice."""
    table = PageTable(16, PS)
    kv = FakeKV(table)
    prompt, gen = list(range(100, 132)), [7, 8, 9, 10] * 12  # page-aligned prompt, three identical pages
    first, seq = run_sequence(table, kv, prompt, len(gen), 1, gen=gen)
    check_table(table, [Live(1, first.pages, seq, len(seq), ROOT)])
    table.release(first.pages, 1)
    again, seq = run_sequence(table, kv, prompt, len(gen), 2, gen=gen)
    indices = [p.index for p in again.pages]
    assert len(set(indices)) == len(indices), indices
    assert again.pages[:4] == first.pages[:4]  # the full pages are found again, each in its place
    kv.check(again.pages, seq, len(seq), ROOT)
    check_table(table, [Live(2, again.pages, seq, len(seq), ROOT)])
    table.release(again.pages, 2)
    check_released(table)
    kv.check_labels()


def test_partial_reuse_never_copies_another_positions_kv():
    """A partial page left behind after a dedup must carry its real predecessor, or partial reuse copies
    K/V computed at other positions into a new prompt."""
    table = PageTable(16, PS)
    kv = FakeKV(table)
    prompt, block, tail = list(range(100, 132)), list(range(200, 216)), [1, 2, 3, 4, 5]
    a, _ = run_sequence(table, kv, prompt, PS + 1, 1, gen=block + [9])
    table.release(a.pages, 1)
    b, _ = run_sequence(table, kv, prompt, PS + len(tail), 2, gen=block + tail)  # block is deduplicated
    table.release(b.pages, 2)
    kv.check_labels()
    probe = prompt + tail + [77]  # the tail at positions 32.. (it was written at 48..)
    c = table.allocate(probe, len(probe) + 1, ROOT, 3)
    kv.check(c.pages, probe, c.cached_tokens, ROOT)
    assert c.cached_tokens == len(prompt)
    table.release(c.pages, 3)


def test_deduplicated_copy_goes_back_to_the_free_pool():
    table = PageTable(8, PS)
    kv = FakeKV(table)
    block = list(range(300, 316))
    a, _ = run_sequence(table, kv, [1, 2, 3], PS + 2, 1, gen=[4] * (PS - 3) + block[:5])
    b, _ = run_sequence(table, kv, [1, 2, 3], PS + 2, 2, gen=[4] * (PS - 3) + block[:5])
    assert b.pages[0] is a.pages[0] and a.pages[0].ref_count == 2
    assert sum(p.kv_position == PS for p in table.pages) == 1  # the duplicate holds nothing any more
    check_table(table, [Live(1, a.pages, [1, 2, 3] + [4] * 13 + block[:5], 20, ROOT),
                        Live(2, b.pages, [1, 2, 3] + [4] * 13 + block[:5], 20, ROOT)])
    table.release(a.pages, 1)
    table.release(b.pages, 2)
    check_released(table)


def test_a_failed_allocation_changes_nothing():
    table = PageTable(4, PS)
    kv = FakeKV(table)
    a, _ = run_sequence(table, kv, list(range(2 * PS)), 1, 1)
    before = [(p.index, p.ref_count, list(p.owners), p.phash, p.kv_position) for p in table.pages]
    with pytest.raises(MemoryError):
        table.allocate(list(range(2 * PS)) + [5], 4 * PS, ROOT, 2)  # shares two pages, still too big
    assert [(p.index, p.ref_count, list(p.owners), p.phash, p.kv_position) for p in table.pages] == before
    table.release(a.pages, 1)
    check_released(table)


# ---------------------------------------------------------------- the state machine

ROOTS = (ROOT, root_hash(("adapter", "x", 1.0)))  # two cache identities (e.g. two LoRA sets)
VOCAB = 6  # few distinct tokens: pages repeat and collide often


class Seq:
    def __init__(self, owner, alloc, prompt, program, root, drafter):
        self.owner, self.pages, self.root = owner, alloc.pages, root
        self.tokens, self.prompt_len, self.program = list(prompt), len(prompt), list(program)
        self.kv_len = alloc.cached_tokens  # tokens whose K/V is in the cache
        self.recorded = self.kv_len  # tokens passed to PageTable.written (may lag: held for banned strings)
        self.drafter = drafter  # drafts with a draft model (CFG and filtered jobs never do)
        self.draft_len = alloc.draft_tokens  # tokens whose K/V the draft model's cache holds
        self.stable = 0  # tokens that can no longer be rewound (recorded before a preemption)
        self._fill = None  # tokens fed as a prompt: the prompt, or all of them after a resume

    @property
    def fill_len(self):
        return self.prompt_len if self._fill is None else min(self._fill, len(self.tokens))

    @property
    def generated(self):
        return len(self.tokens) - self.prompt_len

    def live(self):
        return Live(self.owner, self.pages, self.tokens, self.recorded, self.root)


def tokens(data, min_len, max_len):
    """Random tokens of a drawn length (drawn as one seed: long lists drawn item by item are slow)."""
    rng = random.Random(data.draw(st.integers(0, 2**16)))
    return [rng.randrange(VOCAB) for _ in range(data.draw(st.integers(min_len, max_len)))]


def periodic(data, max_len):
    """A short pattern repeated; mostly to a whole number of pages, so that whole pages repeat."""
    pattern = tokens(data, 1, 4) if data.draw(st.integers(0, 3)) else list(range(PS))
    n = data.draw(st.sampled_from([PS, 2 * PS, 3 * PS]) | st.integers(1, max_len))
    return (pattern * (n // len(pattern) + 1))[:n]


class GenerationMachine(RuleBasedStateMachine):
    """Prompts and generation the way the generator drives the table: chunked prefill, decode with accepted
    and rejected drafts, held (unrecorded) tokens rewound, cancels, re-runs and chat continuations, defrag."""

    def __init__(self):
        super().__init__()
        self.table = PageTable(24, PS)
        self.draft_kv = FakeKV(self.table, "draft_position")  # the draft model's cache mirrors the page layout
        self.kv = FakeKV(self.table, mirror=self.draft_kv)
        self.live: dict[int, Seq] = {}
        self.history: list[tuple[list[int], list[int], bytes]] = []  # (prompt, generated, root) of earlier runs
        self.next_owner = 1

    # -- starting sequences
    def _prompt(self, data):
        kind = data.draw(st.sampled_from(["aligned", "periodic", "rerun", "rerun", "continue", "random"]))
        if kind in ("rerun", "continue") and self.history:
            prompt, generated, root = data.draw(st.sampled_from(self.history))
            if kind == "rerun":  # the same prompt, mostly generating the same again
                program = generated if generated and data.draw(st.integers(0, 3)) else self._program(data, prompt)
                return list(prompt), program, root
            cut = data.draw(st.integers(0, len(generated)))  # next chat turn: earlier prompt + reply + more
            prompt = prompt + generated[:cut] + tokens(data, 1, PS + 3)
            return prompt, self._program(data, prompt), root
        root = data.draw(st.sampled_from(ROOTS))
        if kind == "aligned":
            prompt = tokens(data, PS, PS) * data.draw(st.integers(1, 3))
        elif kind == "periodic":
            prompt = periodic(data, 3 * PS + 4)
        else:
            prompt = tokens(data, 1, 3 * PS + 4)
        return prompt, self._program(data, prompt), root

    def _program(self, data, prompt):
        """The tokens this sequence will generate: whole repeated pages, periodic, the prompt again, random."""
        kind = data.draw(st.sampled_from(["pages", "periodic", "prompt", "random"]))
        if kind == "pages":
            out = tokens(data, PS, PS) * data.draw(st.integers(1, 3)) + tokens(data, 0, PS // 2)
        elif kind == "periodic":
            out = periodic(data, 3 * PS + 4)
        elif kind == "prompt":
            out = (prompt * 4)[: data.draw(st.integers(1, 3 * PS + 4))]
        else:
            out = tokens(data, 1, 2 * PS)
        return out[: 3 * PS + 4] or [0]

    @precondition(lambda self: len(self.live) < 3)
    @rule(data=st.data())
    def start(self, data):
        prompt, program, root = self._prompt(data)
        total = self._admission_len(prompt, program)
        owner = self.next_owner
        self.next_owner += 1
        if not self.table.can_allocate(prompt, total, root):
            before = [(p.ref_count, list(p.owners), p.phash, p.kv_position) for p in self.table.pages]
            with pytest.raises(MemoryError):
                self.table.allocate(prompt, total, root, owner)
            assert [(p.ref_count, list(p.owners), p.phash, p.kv_position) for p in self.table.pages] == before
            return
        alloc = self.table.allocate(prompt, total, root, owner)
        assert len(alloc.pages) == self.table.pages_needed(total)
        assert alloc.cached_tokens <= len(prompt) - 1
        assert alloc.draft_tokens <= alloc.cached_tokens
        self.kv.check(alloc.pages, prompt, alloc.cached_tokens, root)
        self.draft_kv.check(alloc.pages, prompt, alloc.draft_tokens, root)
        self.live[owner] = Seq(owner, alloc, prompt, program, root, data.draw(st.booleans()))

    def _admission_len(self, prompt, program):
        """Tokens a new sequence gets pages for: its whole budget (pages reserved up front)."""
        return len(prompt) + len(program)

    def _room(self, s, n):
        """Make s's pages hold n tokens; False if s lost its pages instead (preempted). Reserved up front here."""
        assert len(s.pages) * PS >= n
        return True

    # -- running them
    def _pick(self, data, want):
        owners = sorted(o for o, s in self.live.items() if want(s))
        return self.live[data.draw(st.sampled_from(owners))] if owners else None

    def _record(self, s, hold=0):
        s.recorded = max(s.recorded, min(s.kv_len, len(s.tokens) - hold))
        self.table.written(s.pages, s.tokens, s.recorded, s.draft_len if s.drafter else 0)

    @precondition(lambda self: any(s.kv_len < s.fill_len - 1 for s in self.live.values()))
    @rule(data=st.data(), budget=st.integers(1, 2 * PS))
    def prefill(self, data, budget):
        self._prefill(self._pick(data, lambda s: s.kv_len < s.fill_len - 1), budget)

    def _prefill(self, s, budget):
        start, last = s.kv_len, s.fill_len - 1
        end = min(last, start + budget)
        if end < last and (end // PS) * PS > start:
            end = (end // PS) * PS  # chunks end on page boundaries
        if not self._room(s, end):
            return
        self.kv.write(s.pages, s.tokens, start, end, s.root)
        if s.drafter:  # the draft model follows, from wherever its cache stops
            self.draft_kv.write(s.pages, s.tokens, min(s.draft_len, start), end, s.root)
            s.draft_len = end
        s.kv_len = end
        self._record(s)

    @precondition(lambda self: any(s.kv_len >= s.fill_len - 1 and s.generated < len(s.program)
                                   for s in self.live.values()))
    @rule(data=st.data(), steps=st.integers(1, 2 * PS))
    def decode(self, data, steps):
        self._decode(data, self._pick(data, lambda s: s.kv_len >= s.fill_len - 1 and s.generated < len(s.program)),
                     steps)

    def _decode(self, data, s, steps):
        """Decode steps: feed the unwritten tail (+ drafts), accept some drafts, record all but held tokens."""
        spec = data.draw(st.booleans())  # speculative decoding, with banned-string holds
        rng = random.Random(data.draw(st.integers(0, 2**16)))
        for _ in range(steps):
            left = len(s.program) - s.generated
            if not left:
                break
            k = min(rng.randint(0, 3), left - 1) if spec and s.kv_len == len(s.tokens) - 1 else 0
            accept = rng.randint(0, k)
            upcoming = s.program[s.generated : s.generated + accept + 1]
            fed = s.tokens + upcoming[:accept] + [100 + i for i in range(k - accept)]  # rejected drafts: other tokens
            if not self._room(s, len(fed)):
                break
            n = len(s.tokens)
            if s.drafter and k:  # the draft model catches up, then runs its first k - 1 drafts
                self.draft_kv.write(s.pages, s.tokens, min(s.draft_len, n - 1), n, s.root)
                self.draft_kv.write(s.pages, fed, n, n + k - 1, s.root)
                s.draft_len = n + min(accept, k - 1)
            self.kv.write(s.pages, fed, s.kv_len, len(fed), s.root)
            s.tokens += upcoming
            s.kv_len = len(s.tokens) - 1
            self._record(s, rng.randint(0, 2) if spec else 0)

    @precondition(lambda self: any(len(s.tokens) > max(s.recorded, s.stable, s.prompt_len) for s in self.live.values()))
    @rule(data=st.data())
    def rewind(self, data):
        """A banned string: held (unrecorded) tokens are taken back and something else is generated."""
        s = self._pick(data, lambda s: len(s.tokens) > max(s.recorded, s.stable, s.prompt_len))
        n = data.draw(st.integers(1, len(s.tokens) - max(s.recorded, s.stable, s.prompt_len)))
        del s.tokens[len(s.tokens) - n :]
        s.kv_len = min(s.kv_len, len(s.tokens) - 1)
        s.draft_len = min(s.draft_len, s.kv_len)
        g = s.generated
        s.program[g : g + n] = [(t + 1) % 6 for t in s.program[g : g + n]]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), budget=st.integers(1, 2 * PS))
    def run_to_end(self, data, budget):
        """Prefill and generate a sequence's whole program, then finish it (runs that repeat earlier ones)."""
        s = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        while s.owner in self.live and s.kv_len < s.fill_len - 1:
            self._prefill(s, budget)
        if s.owner in self.live:
            self._decode(data, s, len(s.program))
        if s.owner in self.live:
            self._finish(s)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish_or_cancel(self, data):
        self._finish(self.live[data.draw(st.sampled_from(sorted(self.live)))])

    def _finish(self, s):
        del self.live[s.owner]
        self._record(s)
        self.table.release(s.pages, s.owner)
        self.history.append((s.tokens[: s.prompt_len], s.tokens[s.prompt_len :], s.root))

    @precondition(lambda self: not self.live)
    @rule()
    def defrag(self):
        order = self.table.defrag_order()
        if order is not None:
            self.kv.permute(order)
            self.table.apply_order(order)

    # -- invariants
    @invariant()
    def table_is_consistent(self):
        check_table(self.table, [s.live() for s in self.live.values()])

    @invariant()
    def cache_holds_what_the_table_says(self):
        for s in self.live.values():
            self.kv.check(s.pages, s.tokens, s.recorded, s.root)
            self.draft_kv.check(s.pages, s.tokens, min(s.draft_len, s.recorded), s.root)
        self.kv.check_labels()
        self.draft_kv.check_labels()

    def teardown(self):
        try:
            check_table(self.table, [s.live() for s in self.live.values()])
        except AssertionError:
            return  # a rule failed half-way: hypothesis reports that error, not a follow-on leak
        for s in list(self.live.values()):
            self.table.release(s.pages, s.owner)
        check_released(self.table)
        self.kv.check_labels()
        self.draft_kv.check_labels()


TestGenerationMachine = GenerationMachine.TestCase
TestGenerationMachine.settings = settings(max_examples=100, stateful_step_count=50, deadline=None, derandomize=True,
                                          database=None, suppress_health_check=[HealthCheck.filter_too_much])

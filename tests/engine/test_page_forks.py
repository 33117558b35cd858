"""Forks on pages on demand: alternatives (n > 1: several jobs on one prompt, the followers admitted once the
leader's prompt is written, as prefill_sharing holds them back, so that they share its pages) and branches
(a new job whose prompt is an earlier point of a running or preempted reply plus a new turn), mixed with
growth, preemption, resume and cancels (a preempted job cancelled while it waits among them), all checked
against a model of the pool: no page leaked, none listed twice by a sequence, every reference count equal to
the live sequences using the page, the free count exactly the pages nobody holds."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, settings, strategies as st
from hypothesis.stateful import precondition, rule

import tests.engine.test_pagetable as base
from tests.engine.test_page_growth import GrowthMachine, snapshot

PS = base.PS


class ForkMachine(GrowthMachine):
    """GrowthMachine plus alternatives, branches and cancels of waiting (preempted) sequences."""

    def _admit_fork(self, data, prompt, root) -> base.Seq | None:
        """Admit a new sequence the way the generator admits a job: its prompt's pages and the next token's slot."""
        owner = self.next_owner
        self.next_owner += 1
        n = len(prompt) + 1
        if not self.table.can_allocate(prompt, n, root):
            before = snapshot(self.table)
            with pytest.raises(MemoryError):
                self.table.allocate(prompt, n, root, owner)
            assert snapshot(self.table) == before
            event("fork refused: no pages")
            return None
        free, cost = self.table.num_unreferenced(), self.table.pages_to_allocate([(prompt, n)], root)
        alloc = self.table.allocate(prompt, n, root, owner)
        assert self.table.num_unreferenced() == free - cost
        assert len(alloc.pages) == self.table.pages_needed(n) and alloc.cached_tokens <= len(prompt) - 1
        self.kv.check(alloc.pages, prompt, alloc.cached_tokens, root)
        self.draft_kv.check(alloc.pages, prompt, alloc.draft_tokens, root)
        s = base.Seq(owner, alloc, prompt, self._program(data, prompt), root, data.draw(st.booleans()))
        self.live[owner] = s
        return s

    @precondition(lambda self: len(self.live) < 5 and any(s.recorded >= s.prompt_len - 1 for s in self.live.values()))
    @rule(data=st.data(), n=st.integers(1, 3))
    def alternatives(self, data, n):
        """n more replies to a running sequence's prompt, once that prompt is written: its full prompt pages
        are found (shared while the leader holds them), and each alternative then grows pages of its own."""
        leader = self._pick(data, lambda s: s.recorded >= s.prompt_len - 1)
        prompt = leader.tokens[: leader.prompt_len]
        shared = (len(prompt) - 1) // PS  # full pages of the prompt that the leader has written and holds
        for _ in range(n):
            follower = self._admit_fork(data, prompt, leader.root)
            if follower is None:
                return
            assert follower.kv_len >= shared * PS  # the leader's prompt is found, not computed again
            same = sum(p is q for p, q in zip(follower.pages[:shared], leader.pages))
            event("alternatives share the leader's pages" if same else "alternatives of a short prompt")

    @precondition(lambda self: len(self.live) < 5 and (self.live or self.preempted))
    @rule(data=st.data())
    def branch(self, data):
        """A new turn from an earlier point of a running or waiting (preempted) sequence: whatever of that
        prefix is still in the cache is found there, live pages shared, cached ones revived."""
        sources = sorted(self.live.items()) + sorted(self.preempted.items())
        _, source = data.draw(st.sampled_from(sources))
        cut = data.draw(st.integers(1, len(source.tokens)))
        prompt = source.tokens[:cut] + base.tokens(data, 1, PS + 3)
        admitted = self._admit_fork(data, prompt, source.root) is not None
        event(f"branch of a {'preempted' if source.owner in self.preempted else 'running'} sequence"
              + ("" if admitted else ": refused"))

    @precondition(lambda self: self.preempted)
    @rule(data=st.data())
    def cancel_while_preempted(self, data):
        """A job cancelled while it waits to resume holds no page: cancelling it changes nothing in the table
        (its written pages stay as prompt cache for others), and it never comes back."""
        before = snapshot(self.table)
        owner = data.draw(st.sampled_from(sorted(self.preempted)))
        s = self.preempted.pop(owner)
        assert s.pages == [] and snapshot(self.table) == before
        assert all(owner not in p.owners for p in self.table.pages)
        event("cancelled while preempted")

    def _preempt(self, s):
        shared = any(p.ref_count > 1 for p in s.pages)
        super()._preempt(s)
        event("preempted while sharing pages" if shared else "preempted")


TestForkMachine = ForkMachine.TestCase
TestForkMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None, derandomize=True,
                                    database=None, suppress_health_check=[HealthCheck.filter_too_much])

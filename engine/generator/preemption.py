"""Pages on demand: a job holds pages for what it has written, takes more as it grows, and gives them all back
(preemption) when the pool runs dry and it ranks lowest of the running jobs.

vLLM's rule (v1 scheduler): admission needs only the prompt's pages; every step, each running sequence first
gets the pages its rows will write, best-ranked job first; when the pool can't give them, the lowest-ranked
running job is preempted (possibly the one asking) and goes back to the front of the queue. Its written full
pages stay in the prefix cache under their hashes, so when it is admitted again only K/V evicted meanwhile is
recomputed (as a prompt chunk: Sequence.fill_len). Everything else the job carries (sampler and its random
state, stream, filters, banned-string holds) never left it, so its output goes on as if nothing happened.

Rank: lower `priority` first (vLLM's convention), then the job enqueued first. The best-ranked job can
always grow (check_job refuses a job the whole cache couldn't hold), so every job finishes.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cache.pagetable import PageTable
    from .job import DynamicJob
    from .metrics import GeneratorMetrics
    from .sequence import Sequence


def rank(job: "DynamicJob") -> tuple[int, int]:
    """Sort key: the smallest runs first and is preempted last."""
    return job.priority, job.serial


def step_len(seq: "Sequence") -> int:
    """Tokens the sequence's pages must hold for this step's mandatory rows: the whole fill while prefilling
    (admission took those pages), else every token so far (the newest is fed now)."""
    return seq.fill_len if seq.kv_len < seq.fill_len - 1 else len(seq.tokens)


class PageGrowth:
    """Admission, growth and preemption over one generator's page table, active list and queue."""

    def __init__(self, table: "PageTable", counters: "GeneratorMetrics"):
        self.table = table
        self.counters = counters

    # ---- admission --------------------------------------------------------------------------------
    def wants(self, job: "DynamicJob") -> list[tuple[list[int], int]]:
        """(tokens to look up in the cache, tokens to hold pages for) per sequence: its tokens so far (those
        that can no longer be rewound: held ones may still change) and one more, the next token's slot."""
        return [(s.tokens[: job.stable_len(s)], min(len(s.tokens) + 1, job.capacity(s))) for s in job.seqs]

    def can_admit(self, job: "DynamicJob", active: list["DynamicJob"]) -> bool:
        """Room for the job's tokens, keeping one page per running sequence free so that they can cross
        their next page boundary without preempting the job just admitted (vLLM's watermark)."""
        reserve = sum(len(j.seqs) for j in active)
        return self.table.pages_to_allocate(self.wants(job), job.lora_root) + reserve <= self.table.num_unreferenced()

    def admit(self, job: "DynamicJob") -> list:
        """Allocate the job's pages; a preempted job resumes (no new 'started' result). Returns the allocations."""
        allocs = [self.table.allocate(toks, n, job.lora_root, job.serial) for toks, n in self.wants(job)]
        if job.started:
            lost = job.preempted_kv or [0] * len(allocs)
            self.counters.resumes_total += 1
            self.counters.recomputed_tokens_total += sum(max(0, k - a.cached_tokens) for k, a in zip(lost, allocs))
            job.resume(allocs)
        return allocs

    # ---- growth -----------------------------------------------------------------------------------
    def grow(self, active: list["DynamicJob"], pending: deque) -> None:
        """Give every running sequence the pages this step writes, best-ranked job first; preempt the
        lowest-ranked running job while the pool can't (the asking job itself when it ranks lowest)."""
        for job in sorted(active, key=rank):
            if job not in active:
                continue  # preempted earlier in this loop
            while not self._grow_job(job):
                victim = max(active, key=rank)
                self.preempt(victim, active, pending)
                if victim is job:
                    break

    def _grow_job(self, job: "DynamicJob") -> bool:
        targets = [(seq, step_len(seq)) for seq in job.seqs]
        short = sum(max(0, self.table.pages_needed(n) - len(seq.pages)) for seq, n in targets)
        if short == 0:
            return True
        if short > self.table.num_unreferenced():
            return False
        for seq, n in targets:
            if not self.table.grow(seq.pages, n, job.lora_root, job.serial):
                raise RuntimeError("the page table refused pages it had counted as free")
        return True

    def grow_for_drafts(self, job: "DynamicJob", k: int) -> int:
        """How many of k draft tokens the job's pages can take; a page more is taken if free, never by
        preempting anyone (drafts are an optimisation)."""
        seq = job.seq
        ps = self.table.page_size
        if len(seq.pages) * ps - len(seq.tokens) < k:
            self.table.grow(seq.pages, len(seq.tokens) + k, job.lora_root, job.serial)
        return max(0, min(k, len(seq.pages) * ps - len(seq.tokens)))

    def preempt(self, job: "DynamicJob", active: list["DynamicJob"], pending: deque) -> None:
        """Give the job's pages back and queue it ahead of every job not yet started, among the other
        preempted ones by rank."""
        job.preempted_kv = [seq.kv_len for seq in job.seqs]
        for seq in job.seqs:
            self.table.release(seq.detach(), job.serial)
        active.remove(job)
        job.preemptions += 1
        self.counters.preemptions_total += 1
        resumable = sorted([j for j in pending if j.started] + [job], key=rank)
        fresh = [j for j in pending if not j.started]
        pending.clear()
        pending.extend(resumable + fresh)

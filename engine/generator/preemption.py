"""Pages on demand: a job holds pages for what it has written, takes more as it grows, and gives them all back
(preemption) when the pool runs dry and it ranks lowest of the running jobs.

vLLM's rule (v1 scheduler): admission needs only the prompt's pages; every step, each running sequence first
gets the pages its rows will write, best-ranked job first; when the pool can't give them, the lowest-ranked
running job is preempted (possibly the one asking) and goes back to the front of the queue. Its written full
pages stay in the prefix cache under their hashes, so when it is admitted again only K/V evicted meanwhile is
recomputed (as a prompt chunk: Sequence.fill_len), and the page table recycles them only after every cached
page no queued job waits for (PageTable.awaited). Everything else the job carries (sampler and its random
state, stream, filters, banned-string holds) never left it, so its output goes on as if nothing happened.

Rank: lower `priority` first (vLLM's convention), then the job enqueued first. The best-ranked job can
always grow (check_job refuses a job the whole cache couldn't hold), so every job finishes. Rank also decides
admission (admission.py): a queued job that outranks running ones may take their pages (make_room), as a
higher-priority request does in vLLM's priority scheduling. A job's priority may change while it waits or runs
(Reranks: DynamicGenerator.set_priority, from any thread, applied at the start of the next step).
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .metrics import preempted_pages

if TYPE_CHECKING:
    from ..cache.pagetable import CachePage, PageTable
    from .job import DynamicJob
    from .metrics import GeneratorMetrics
    from .sequence import Sequence


def rank(job: "DynamicJob") -> tuple[int, int]:
    """Sort key: the smallest runs first and is preempted last."""
    return job.priority, job.serial


class Reranks:
    """Priority changes asked for from any thread, applied by the generator's thread between two steps (a
    rank never changes in the middle of admission or growth)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: dict["DynamicJob", int] = {}

    def ask(self, job: "DynamicJob", priority: Any) -> None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an int, got {priority!r}")
        with self._lock:
            if job.serial is None:  # not queued yet (DynamicJobAsync enqueues on the worker): it starts with it
                job.priority = priority
            self._asked[job] = priority

    def apply(self, jobs: list["DynamicJob"]) -> None:
        """Give each listed job (queued or running) the priority last asked for it; a job that ended meanwhile
        has nothing left to rank."""
        with self._lock:
            asked, self._asked = self._asked, {}
        for job in jobs:
            if job in asked:
                job.priority = asked[job]


@dataclass(eq=False)
class CachedPage:
    """A page a preempted job left in the prompt cache, as it was then: it is still that job's K/V while
    nobody has reused it (the page map draws it apart: the job resumes from it)."""

    page: "CachePage"
    prev_hash: bytes | None
    tokens: list[int]

    def still_held(self) -> bool:
        p = self.page
        return p.ref_count == 0 and p.kv_position > 0 and p.prev_hash == self.prev_hash and p.tokens == self.tokens


def step_len(seq: "Sequence") -> int:
    """Tokens the sequence's pages must hold for this step's mandatory rows: the whole fill while prefilling
    (admission took those pages), else every token so far (the newest is fed now)."""
    return seq.fill_len if seq.kv_len < seq.fill_len - 1 else len(seq.tokens)


class PageGrowth:
    """Admission, growth and preemption over one generator's page table, active list and queue."""

    def __init__(self, table: "PageTable", counters: "GeneratorMetrics"):
        self.table = table
        self.counters = counters

    def await_resumes(self, pending: deque) -> None:
        """Tell the page table which cached pages the queued jobs will resume from (a cancelled or resumed job's
        stop counting at the next step)."""
        self.table.awaited = set(preempted_pages(pending))

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
            recomputed = sum(max(0, k - a.cached_tokens) for k, a in zip(lost, allocs))
            self.counters.resumes_total += 1
            self.counters.recomputed_tokens_total += recomputed
            job.resumes += 1
            job.recomputed_tokens += recomputed
            job.preempted_pages = []
            job.resume(allocs)
        return allocs

    def make_room(self, job: "DynamicJob", active: list["DynamicJob"], pending: deque) -> bool:
        """Preempt running jobs ranked below `job`, worst first, as few as let it in; none when even all of
        them would not. True when the job can be admitted now."""
        worse = sorted((j for j in active if rank(j) > rank(job)), key=rank, reverse=True)
        if not worse:
            return False
        wants = self.wants(job)
        hashes = {h for toks, _ in wants for h in self.table.prompt_hashes(toks, job.lora_root)}
        need = self.table.pages_to_allocate(wants, job.lora_root)
        room = self.table.num_unreferenced() - sum(len(j.seqs) for j in active)  # less the watermark
        refs: dict[int, int] = {}
        victims = []
        for victim in worse:
            victims.append(victim)
            room += len(victim.seqs)
            for seq in victim.seqs:
                for page in seq.pages:
                    left = refs.get(page.index, page.ref_count) - 1
                    refs[page.index] = left
                    if left == 0:
                        room += 1
                        need += page.phash in hashes  # a prompt page it shares costs a page once unreferenced
            if need <= room:
                for v in victims:
                    self.preempt(v, active, pending)
                return self.can_admit(job, active)
        return False

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
        """Give the job's pages back and queue it again (admission takes the queue in rank order, so it
        resumes before every job it outranks, new or preempted)."""
        job.preempted_kv = [seq.kv_len for seq in job.seqs]
        kept = []
        for seq in job.seqs:
            pages = seq.detach()
            self.table.release(pages, job.serial)
            kept += [CachedPage(p, p.prev_hash, list(p.tokens)) for p in pages if p.ref_count == 0 and p.kv_position]
        job.preempted_pages = kept
        self.table.awaited.update(c.page.index for c in kept)
        active.remove(job)
        job.preemptions += 1
        self.counters.preemptions_total += 1
        pending.append(job)

"""Admission: which queued jobs start (or resume) this step, in rank order (vLLM's priority scheduling).

The queue is taken best-ranked first (preemption.rank: lower `priority`, then the job enqueued first), so a
preempted job and a new one are ordered by the same rule and equal priorities keep arrival order. A job that
doesn't fit may first take the pages of running jobs it outranks (PageGrowth.make_room); if it still doesn't,
a new job may be passed by jobs ranked after it up to its max_skips times and then blocks the queue, so among
equal priorities nobody starves; a preempted job is never passed (it resumes before anything it outranks).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from .preemption import PageGrowth, rank
from .prefill_sharing import follows_prefill

if TYPE_CHECKING:
    from .job import DynamicJob
    from .metrics import GeneratorMetrics


class Admission:
    def __init__(self, growth: PageGrowth, counters: "GeneratorMetrics", page_size: int):
        self.growth = growth
        self.counters = counters
        self.page_size = page_size

    def admit(self, pending: deque["DynamicJob"], active: list["DynamicJob"], results: list[dict],
              max_batch_size: int, max_q_size: int) -> None:
        """Start or resume queued jobs, best-ranked first, while fewer than max_batch_size run and fewer than
        max_q_size prefill; a new job's 'started' result goes to `results`."""
        waiting: list[DynamicJob] = []
        started_after_wait = False
        for job in sorted(pending, key=rank):
            if len(active) >= max_batch_size:
                break
            if sum(j.prefilling for j in active) >= max_q_size:
                break
            if not job.started and follows_prefill(job, active, self.page_size):
                continue  # its prompt is being prefilled by a running job: reuse those pages once written
            if not self.growth.can_admit(job, active) and not self.growth.make_room(job, active, pending):
                if job.started or job.skips >= job.max_skips:
                    break  # this job has waited long enough: nobody ranked after it goes ahead of it
                waiting.append(job)
                continue
            resuming = job.started
            allocs = self.growth.admit(job)
            pending.remove(job)
            active.append(job)
            if resuming:
                continue
            self.counters.prefix_hit_tokens_total += sum(a.cached_tokens for a in allocs)
            self.counters.prompt_tokens_total += sum(s.prompt_len for s in job.seqs)
            results.append(job.start(allocs))
            started_after_wait = started_after_wait or bool(waiting)
        if started_after_wait:
            for job in waiting:
                job.skips += 1

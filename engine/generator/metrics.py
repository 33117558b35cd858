"""Raw, monotonic generator counters and the snapshot the dashboard polls (~10 Hz, from any thread).

The snapshot reads plain attributes without taking the generator's lock, so it never waits for a forward
pass; a snapshot may straddle two steps, which a chart can't tell apart.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class GeneratorMetrics:
    steps_total: int = 0
    tokens_generated_total: int = 0
    prefill_tokens_total: int = 0
    prefix_hit_tokens_total: int = 0
    prompt_tokens_total: int = 0  # prompt tokens of admitted jobs (cached or not): prefix-cache queries
    drafts_total: int = 0  # draft proposals (one per job per drafting step), vLLM's num_drafts
    drafted_tokens_total: int = 0
    accepted_tokens_total: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    preemptions_total: int = 0  # running jobs that gave their pages back because the pool ran dry
    resumes_total: int = 0  # preempted jobs admitted again
    recomputed_tokens_total: int = 0  # tokens of K/V lost to preemption and computed again on resume
    time_total_s: float = 0.0  # time spent inside iterate()
    batch_size: int = 0  # sequences in the last step
    batch_size_peak: int = 0  # largest batch_size so far (a scrape every few seconds misses short peaks)
    prefill_tokens_step: int = 0
    decode_tokens_step: int = 0
    sampling_threads_busy: int = 0
    step_host_overhead_s: float = 0.0  # last step's time outside model.forward

    def record_step(self, batch_size: int, prefill: int, decode: int, seconds: float, overhead: float) -> None:
        self.steps_total += 1
        self.batch_size = batch_size
        self.batch_size_peak = max(self.batch_size_peak, batch_size)
        self.prefill_tokens_step = prefill
        self.decode_tokens_step = decode
        self.prefill_tokens_total += prefill
        self.time_total_s += seconds
        self.step_host_overhead_s = overhead

    def snapshot(self) -> dict:
        d = {k: (list(v) if isinstance(v, list) else v) for k, v in vars(self).items()}
        d["snapshot_time"] = time.monotonic()
        return d


def _counts(job) -> dict:
    return {"identifier": job.identifier, "preemptions": job.preemptions, "resumes": job.resumes,
            "recomputed_tokens": job.recomputed_tokens}


class JobPreemptions:
    """Per-job preemption counters for a per-chat view (metrics' `job_preemptions`, by serial): every queued
    or running job preempted so far, and the last `keep` such jobs that ended, so a dashboard polling at
    10 Hz still sees a job preempted just before it finished."""

    def __init__(self, keep: int = 256):
        self._ended: deque[tuple[int, dict]] = deque(maxlen=keep)

    def ended(self, job) -> None:
        if job.preemptions:
            self._ended.append((job.serial, _counts(job)))

    def snapshot(self, jobs: list) -> dict[int, dict]:
        out = dict(list(self._ended))
        out.update((j.serial, _counts(j)) for j in jobs if j.preemptions)
        return out


def preempted_pages(pending: list) -> dict[int, int]:
    """page index -> serial of the preempted job whose K/V it still holds in the prompt cache (it resumes
    from those pages unless other jobs take them first)."""
    return {c.page.index: j.serial for j in pending for c in list(j.preempted_pages) if c.still_held()}

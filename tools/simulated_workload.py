"""A plausible generator serving several chats, as metrics()-shaped snapshots, with no engine or model:
it feeds the dashboard in the README screenshot (tools.screenshots.readme) and in its benchmark
(tools.bench.dashboard_bench), deterministically."""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from engine.contract import CACHED, FREE

CHATS = (
    ("chat-1", "Rust borrow checker"), ("chat-2", "Trip to Lisbon"), ("chat-3", "SQL window functions"),
    ("chat-4", "Poem about autumn"), ("chat-5", "Explain KV caches"), ("chat-6", "Unit tests for parser"),
)


class SimulatedWorkload:
    """A plausible generator serving several chats, as metrics()-shaped dicts; no engine or model needed.

    Jobs share a system-prompt prefix page (hash-shared pages), grow page by page while decoding, leave
    their pages cached when done, and a LoRA swap mid-run defers new requests until running jobs drain.
    """

    def __init__(self, pages_total: int = 1024, page_size: int = 256, seed: int = 0, max_batch: int = 8,
                 arrival_rate: float = 0.6, swap_at: float | None = 38.0, speculative: bool = True) -> None:
        if pages_total < 8:
            raise ValueError(f"SimulatedWorkload needs at least 8 pages, got {pages_total}")
        self.rng = np.random.default_rng(seed)
        self.pages_total, self.page_size, self.max_batch = pages_total, page_size, max_batch
        self.arrival_rate, self.swap_at, self.speculative = arrival_rate, swap_at, speculative
        self.states = np.full(pages_total, FREE, np.int64)
        self.holders: list[list[int]] = [[] for _ in range(pages_total)]
        self.free: deque[int] = deque(range(pages_total))
        self.cached: deque[int] = deque()  # LRU: oldest first
        self.prefix: list[int] = []  # the shared system-prompt page(s)
        self.jobs: dict[int, dict] = {}
        self.pending: deque[dict] = deque()
        self.deferred: deque[dict] = deque()
        self.serial = 0
        self.elapsed = 0.0
        self.start_time = 1000.0
        self.loras: list[str] = []
        self.swapping = False
        self.c = dict(tokens=0, steps=0, drafted=0, accepted=0, prefix_hits=0)
        self.per_position = [0, 0, 0, 0]
        self.last_prefill = self.last_decode = self.last_batch = self.last_busy = self.peak_batch = 0

    # ------------------------------------------------------------------------------- page table
    def _take_page(self) -> int | None:
        if self.free:
            return self.free.popleft()
        while self.cached:
            page = self.cached.popleft()
            if page in self.prefix:
                self.prefix = []
            return page
        return None

    def _hold(self, page: int, serial: int) -> None:
        self.holders[page].append(serial)
        self.states[page] = self.holders[page][0]

    def _release(self, job: dict) -> None:
        for page in job["pages"]:
            self.holders[page].remove(job["serial"])
            if self.holders[page]:
                self.states[page] = self.holders[page][0]
            else:
                self.states[page] = CACHED
                self.cached.append(page)

    # ------------------------------------------------------------------------------- scheduling
    def _arrive(self) -> None:
        chat, _ = CHATS[int(self.rng.integers(len(CHATS)))]
        job = dict(serial=self.serial, chat=chat, prompt=int(self.rng.integers(400, 3000)),
                   target=int(self.rng.integers(150, 700)), done=0, prefilled=0, pages=[])
        if self.jobs and self.rng.random() < 0.35:  # "regenerate" on a chat that is still streaming
            source = self.jobs[int(self.rng.choice(list(self.jobs)))]
            job.update(chat=source["chat"], prompt=source["prompt"], branch_of=source["serial"])
        self.serial += 1
        (self.deferred if self.swapping else self.pending).append(job)

    def _admit(self, job: dict) -> bool:
        need = math.ceil(job["prompt"] / self.page_size)
        if len(self.free) + len(self.cached) < need + 1:
            return False
        branch = job.get("branch_of")
        if branch in self.jobs:  # regenerate / branch: the full prompt pages are shared by hash
            source = self.jobs[branch]
            shared = source["pages"][:source["prompt"] // self.page_size]
            for p in shared:
                self._hold(p, job["serial"])
            job["pages"] += shared
            job["prefilled"] = len(shared) * self.page_size
            self.c["prefix_hits"] += job["prefilled"]
        elif self.prefix and all(self.holders[p] or p in self.cached for p in self.prefix):
            for p in self.prefix:
                if p in self.cached:
                    self.cached.remove(p)
                self._hold(p, job["serial"])
            job["pages"] += self.prefix
            job["prefilled"] = len(self.prefix) * self.page_size
            self.c["prefix_hits"] += job["prefilled"]
        while len(job["pages"]) < need:
            page = self._take_page()
            self._hold(page, job["serial"])
            job["pages"].append(page)
        if not self.prefix:
            self.prefix = job["pages"][:1]
        self.jobs[job["serial"]] = job
        return True

    def step(self, dt: float = 0.1) -> dict:
        """Advance `dt` seconds and return the snapshot a metrics() call would give then."""
        self.elapsed += dt
        for _ in range(int(self.rng.poisson(self.arrival_rate * dt))):
            self._arrive()
        if self.swap_at is not None and not self.swapping and self.elapsed >= self.swap_at and not self.loras:
            self.swapping = True
        if self.swapping and not self.jobs:
            self.swapping, self.loras = False, ["pirate-style"]
            self.pending.extend(self.deferred)
            self.deferred.clear()
        while self.pending and not self.swapping and len(self.jobs) < self.max_batch and self._admit(self.pending[0]):
            self.pending.popleft()
        prefill = decode = 0
        per_job_rate = 70.0 / (1.0 + 0.12 * len(self.jobs))
        for job in list(self.jobs.values()):
            if job["prefilled"] < job["prompt"]:
                chunk = min(job["prompt"] - job["prefilled"], int(4000 * dt))
                job["prefilled"] += chunk
                prefill += chunk
                continue
            new = int(self.rng.poisson(per_job_rate * dt * (1.6 if self.speculative else 1.0)))
            job["done"] += new
            decode += new
            if self.speculative and new:
                drafted = 4 * max(1, new // 2)
                accepted = min(drafted, int(self.rng.binomial(drafted, 0.62)))
                self.c["drafted"] += drafted
                self.c["accepted"] += accepted
                for i in range(min(4, accepted)):
                    self.per_position[i] += 1
            while (job["prompt"] + job["done"]) > len(job["pages"]) * self.page_size:
                page = self._take_page()
                if page is None:
                    break
                self._hold(page, job["serial"])
                job["pages"].append(page)
            if job["done"] >= job["target"]:
                self._release(job)
                del self.jobs[job["serial"]]
        self.c["tokens"] += decode
        self.c["steps"] += int(round(dt / 0.02))
        self.last_prefill, self.last_decode, self.last_batch = prefill, decode, len(self.jobs)
        self.peak_batch = max(self.peak_batch, self.last_batch)
        self.last_busy = min(len(self.jobs), 16) if len(self.jobs) >= 3 else 0
        return self.snapshot()

    def snapshot(self) -> dict:
        free, cached = int(np.count_nonzero(self.states == FREE)), int(np.count_nonzero(self.states == CACHED))
        return {
            "pages_total": self.pages_total, "pages_referenced": self.pages_total - free - cached,
            "pages_cached": cached, "pages_free": free, "page_states": self.states.tolist(),
            "page_shared": [len(h) > 1 for h in self.holders], "page_size": self.page_size,
            "page_owner_identifiers": {s: j["chat"] for s, j in self.jobs.items()},
            "active_jobs": len(self.jobs), "pending_jobs": len(self.pending), "deferred_jobs": len(self.deferred),
            "batch_size": self.last_batch, "prefill_tokens_step": self.last_prefill,
            "decode_tokens_step": self.last_decode, "tokens_generated_total": self.c["tokens"],
            "prefill_tokens_total": 0, "steps_total": self.c["steps"], "time_total_s": self.elapsed,
            "drafted_tokens_total": self.c["drafted"], "accepted_tokens_total": self.c["accepted"],
            "accepted_per_position": list(self.per_position), "sampling_threads_busy": self.last_busy,
            "step_host_overhead_s": 0.0, "batch_size_peak": self.peak_batch, "prompt_tokens_total": 0,
            "drafts_total": self.c["drafted"] // 4,
            "preemptions_total": 0, "resumes_total": 0, "recomputed_tokens_total": 0,  # it never preempts
            "job_preemptions": {}, "preempted_pages": {},
            "sampling_threads_max": 16, "prefix_hit_tokens_total": self.c["prefix_hits"], "loras": list(self.loras),
            "loras_loaded": list(self.loras),  # every simulated page ran the base model:
            "page_adapters": np.where(self.states == FREE, -1, 0).tolist(), "adapter_sets": {0: []},
            "experts": None,  # a dense model
            "snapshot_time": self.start_time + self.elapsed,
        }

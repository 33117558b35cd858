"""DynamicGenerator: a job queue, a scheduler and one batched forward per iterate().

One iterate() admits queued jobs (best-ranked first: priority, then arrival, see admission.py), gives
every prefilling job one page-aligned chunk (within a shared per-step budget, a fair share in solo time, see
step_budget.py: a long prompt and the chats decoding beside it are slowed alike; only chats that were already
decoding when the prompt arrived are shielded so: prompts queued together go in at full speed, first come first
served), and decodes one token for every decoding job, all in one varlen forward pass. Jobs join and leave at
any step, each with its own LoRA adapters (adapters.py).
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from ..cache.paged_cache import PagedCache
from ..cache.pagetable import PageTable
from ..contract import CACHED, FREE, Metrics, Result, SamplerSettings
from ..model.batch import Batch
from ..model.model import Model
from ..sampling.draw import draw_cfg, draw_verified
from ..sampling.pool import SamplingPool
from .adapters import Adapters
from .admission import Admission
from .heap_trim import HeapTrim
from .job import DynamicJob, JobContext
from .embeddings import FIRST_ID
from .expert_stats import ExpertStats
from .metrics import GeneratorMetrics, JobPreemptions, preempted_pages
from .mm_inputs import chunk_end, no_placeholders, step_inputs
from .preemption import PageGrowth, Reranks
from .sequence import ScheduledSeq
from .speculative import ModelDrafter, check_draft_model
from .step_budget import StepBudget

if TYPE_CHECKING:
    from ..model.tokenizer import Tokenizer


def page_copier(*caches: PagedCache | None):
    """copy_fn for the page table: partial-page reuse copies a page's K/V in every cache (main and draft)."""
    live = [c for c in caches if c is not None]

    def copy_page(src: int, dst: int, n: int) -> None:
        for cache in live:
            cache.copy_page(src, dst, n)

    return copy_page


class DynamicGenerator:
    def __init__(
        self,
        model: Model,
        cache: PagedCache,
        tokenizer: "Tokenizer",
        max_batch_size: int | None = None,
        max_seq_len: int | None = None,
        max_chunk_size: int | None = None,
        max_q_size: int = 8,
        draft_model: Model | None = None,
        draft_cache: PagedCache | None = None,
        num_draft_tokens: int = 4,
        use_ngram_draft: bool = False,
        max_ngram: int = 4,
        max_sampling_threads: int = 16,
        min_sampling_threads: int = 3,
        filter_background_eval: bool = True,
        max_draft_batch_size: int = 16,  # drafting still paid at 16 (n-gram, 85 % acceptance): README
        prefill_share: float | None = 1.0,  # while others decode, prefill gets this x their solo-time share
    ):
        if draft_model is None and draft_cache is not None:
            raise ValueError("draft_cache was given without a draft_model")
        if draft_model is not None and use_ngram_draft:
            raise ValueError("choose one kind of speculation: a draft model or n-gram drafting, not both")
        if draft_model is not None:
            check_draft_model(model, cache, draft_model, draft_cache)
        cache.spec.check_serves(model.cache_spec())
        for name, value in (("num_draft_tokens", num_draft_tokens), ("max_ngram", max_ngram), ("max_q_size", max_q_size),
                            ("max_sampling_threads", max_sampling_threads),
                            ("max_draft_batch_size", max_draft_batch_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if draft_cache is cache:
            raise ValueError("draft_cache must be a cache of its own, not the main cache")
        if cache.claimed or (draft_cache is not None and draft_cache.claimed):
            raise ValueError("this PagedCache already serves another DynamicGenerator: give each generator its own "
                             "cache (one page table decides what a cache's pages hold)")
        self.model = model
        self.cache = cache
        self.tokenizer = tokenizer
        self.page_size = cache.page_size
        self.max_seq_len = max_seq_len or min(cache.max_tokens, model.config.max_position_embeddings)
        self.rotary = model.rotary_for(self.max_seq_len)  # this generator's, never the shared model's
        self.max_batch_size = max_batch_size or min(cache.num_pages, 128)
        # With the step budget, a step prefills big chunks only while nobody decodes; without it, a CPU step
        # of 256 prompt tokens already stalls every decoding chat for ~1 s.
        big = prefill_share is not None or model.device.type == "cuda"
        self.max_chunk_size = max_chunk_size or (2048 if big else 256)
        if self.max_chunk_size < 1 or self.max_batch_size < 1:
            raise ValueError("max_chunk_size and max_batch_size must be positive")
        self.max_q_size = max_q_size
        # None: every step may prefill max_chunk_size tokens whatever it costs the decoding jobs
        self.step_budget = StepBudget(self.max_chunk_size, prefill_share) if prefill_share is not None else None
        self.num_draft_tokens = num_draft_tokens
        self.max_ngram = max_ngram
        self.filter_background_eval = filter_background_eval
        self.vocab_size = min(model.vocab_size, tokenizer.vocab_size)
        self.draft_cache = draft_cache
        # A function of the caches, not a bound method: the table then holds no reference back to the
        # generator, whose model and cache go at once when the last reference to it does (a reload frees the
        # old model then, not at some later full garbage collection).
        self.pagetable = PageTable(cache.num_pages, cache.page_size, page_copier(cache, draft_cache))
        self.drafter = ModelDrafter(draft_model, draft_cache, self.pagetable) if draft_model is not None else None
        self.use_ngram_draft = use_ngram_draft
        self.max_draft_batch_size = max_draft_batch_size
        self.job_context = JobContext(tokenizer, self.vocab_size, max_ngram if use_ngram_draft else None,
                                      self.max_seq_len)
        self.pending: deque[DynamicJob] = deque()
        self.active: list[DynamicJob] = []
        self.sampling_pool = SamplingPool(max_sampling_threads, min_sampling_threads)
        self.counters = GeneratorMetrics(accepted_per_position=[0] * num_draft_tokens)
        self.growth = PageGrowth(self.pagetable, self.counters)  # pages on demand, preemption when they run out
        self.admission = Admission(self.growth, self.counters, self.page_size)
        self.reranks = Reranks()  # set_priority's changes, applied at the next step
        self.job_preemptions = JobPreemptions()
        self.experts = ExpertStats.of(model)  # a MoE model's expert counts (metrics' experts); off for a dense one
        self.adapters = Adapters(model)  # this generator's LoRAs (never on the shared model)
        self._filter_executor: ThreadPoolExecutor | None = None
        self._serials = itertools.count()
        self.heap = HeapTrim()  # freed step temporaries back to the OS now and then (a long run's RSS stays flat)
        for c in (cache, draft_cache):  # last: a generator that fails to build claims nothing
            if c is not None:
                c.claimed = True

    # ---- queue ------------------------------------------------------------------------------------
    def enqueue(self, job: DynamicJob | list[DynamicJob]) -> int | list[int]:
        """Queue a job (or several); returns its serial. It starts with pages for its prompt and takes more as
        it grows (preemption.py: when the cache runs dry, the latest jobs wait for the earliest)."""
        if isinstance(job, list):
            return [self.enqueue(j) for j in job]
        self.check_job(job)
        return self.enqueue_checked(job)

    def enqueue_checked(self, job: DynamicJob) -> int:
        """Queue a job check_job already accepted (DynamicJobAsync checks at construction, on the caller's
        thread: what check_job reads besides the adapters never changes). Its adapters are resolved against
        the registry as it is now, so one unloaded meanwhile is still refused. Returns its serial."""
        loras, root = self.adapters.resolve(job.lora_request)
        job.bind(self.job_context, next(self._serials), loras, root)
        self.pending.append(job)
        return job.serial

    def check_job(self, job: DynamicJob) -> None:
        """Raise if this generator could never run the job; reads settings only, so any thread may call it."""
        if not isinstance(job, DynamicJob):
            raise TypeError(f"enqueue takes DynamicJob objects, got {type(job).__name__}")
        if job.serial is not None:
            raise ValueError(f"job {job.serial} is already enqueued (a job runs once; make a new one)")
        longest = max(s.prompt_len for s in job.seqs)
        new = job.max_new_tokens if job.max_new_tokens is not None else self.max_seq_len - longest
        if new < 1 or longest + new > self.max_seq_len:
            raise ValueError(f"prompt ({job.prompt_len} tokens) + max_new_tokens ({job.max_new_tokens}) exceeds "
                             f"max_seq_len ({self.max_seq_len})")
        if sum(self.pagetable.pages_needed(s.prompt_len + new) for s in job.seqs) > self.cache.num_pages:
            raise ValueError(f"prompt + max_new_tokens ({longest + new} tokens) needs more pages than the whole cache "
                             f"({self.cache.num_pages} pages of {self.page_size}): it could never finish, even alone")
        tokens = [t for s in job.seqs for t in s.tokens if t < FIRST_ID]  # placeholders: DynamicJob checked them
        if job.embeddings and job.embeddings.hidden != self.model.config.hidden_size:
            raise ValueError(f"the job's embeddings are {job.embeddings.hidden} wide; the model's hidden size is "
                             f"{self.model.config.hidden_size} (were they made for another model?)")
        if tokens and (max(tokens) >= self.model.vocab_size or min(tokens) < 0):
            raise ValueError(f"input_ids hold token ids outside the model's vocabulary (0..{self.model.vocab_size - 1})")
        self.adapters.check(job.lora_request)  # its adapters are loaded and not being unloaded

    def num_remaining_jobs(self) -> int:
        return len(self.pending) + len(self.active)

    def cancel(self, job: DynamicJob) -> None:
        """Remove a queued or running job; its pages go back to the pool (written ones stay as prompt cache)."""
        if job in self.pending:
            self.pending.remove(job)
            self.job_preemptions.ended(job)
            self._collect_adapters()
        elif job in self.active:
            self._end(job)
        else:
            raise ValueError(f"{job!r} is not queued or running in this generator")

    def set_priority(self, job: DynamicJob, priority: int) -> None:
        """Re-rank a queued or running job (lower runs first, vLLM's convention); safe from any thread. It
        takes effect at the start of the next step: admission and preemption then rank the job anew (a job
        now ranked below a queued one may give its pages to it). A job not enqueued yet is enqueued with it; one
        that ended meanwhile is left alone."""
        self.reranks.ask(job, priority)

    def clear_queue(self) -> None:
        for job in list(self.pending) + list(self.active):
            self.cancel(job)

    # ---- the step ---------------------------------------------------------------------------------
    def iterate(self) -> list[Result]:
        """Advance every job by one step; returns the results (see ARCHITECTURE.md) produced by it."""
        t0 = time.perf_counter()
        results: list[dict] = []
        self.reranks.apply(list(self.pending) + self.active)
        self.growth.await_resumes(self.pending)
        self.admission.admit(self.pending, self.active, results, self.max_batch_size, self.max_q_size)
        self.growth.grow(self.active, self.pending)
        if not self.active:
            return results
        plan = self._plan()
        logits, offsets, t_forward, n_tokens = self._forward(plan)
        self._collect(plan, offsets, logits, results)
        n_prefill = sum(len(e.tokens) for e in plan if e.prefill)
        self.counters.sampling_threads_busy = self.sampling_pool.busy_last
        elapsed = time.perf_counter() - t0
        self.counters.record_step(len(plan), n_prefill, n_tokens - n_prefill, elapsed, elapsed - t_forward)
        if self.step_budget is not None:
            self.step_budget.record(n_prefill, n_tokens - n_prefill, elapsed)
        idle = not self.active and not self.pending
        if idle:
            self.defrag_cache()
        self.heap.after_step(idle)
        return results

    def _forward(self, plan: list[ScheduledSeq]) -> tuple[torch.Tensor, tuple[int, ...], float, int]:
        """One varlen forward for the whole plan (filter masks are evaluated meanwhile); logits on the CPU
        and where each scheduled sequence's rows start in them."""
        batch = Batch.build([(e.tokens, e.start, e.seq.page_ids(e.end, self.pagetable)) for e in plan],
                            self.page_size, [e.rows for e in plan], self.model.device, [e.prompt_rows for e in plan])
        batch.mm_rows, batch.mm_vectors, batch.mm_blocks = step_inputs(plan, self.model.bidirectional_images,
                                                                        self.model.device)
        t0 = time.perf_counter()
        filtered = [job for job in {e.job: None for e in plan if e.rows} if job.filters]
        masks = None
        if filtered and self.filter_background_eval:  # overlap grammar work with the forward pass
            masks = self._filter_pool().submit(lambda: [job.compute_filter_mask() for job in filtered])
        lora = self.adapters.step([(len(e.tokens), e.job.loras) for e in plan])
        with self.experts.step(plan):
            logits = self.model.forward(batch, self.cache, lora=lora, rotary=self.rotary)
        if self.drafter is not None:
            self.drafter.prefill([(e.seq, e.tokens, e.start) for e in plan
                                  if e.prefill and not e.job.cfg and not e.job.embeddings])
        if masks is not None:
            masks.result()
        else:
            for job in filtered:
                job.compute_filter_mask()
        elapsed = time.perf_counter() - t0
        logits = logits.cpu() if logits.device.type != "cpu" else logits
        return logits, batch.logit_offsets, elapsed, batch.input_ids.shape[0]

    def _collect(self, plan: list[ScheduledSeq], offsets: tuple[int, ...], logits: torch.Tensor,
                 results: list[dict]) -> None:
        """Sample every job that has logits (in the thread pool), then advance its sequences and report."""
        by_job: dict[DynamicJob, list[ScheduledSeq]] = {}
        first_row: dict[ScheduledSeq, int] = {}
        for e, row in zip(plan, offsets):
            first_row[e] = row
            by_job.setdefault(e.job, []).append(e)
        sampling = [(job, es) for job, es in by_job.items() if any(e.rows for e in es)]
        draws = dict(zip((job for job, _ in sampling), self.sampling_pool.run(
            [(lambda job=job, es=es: self._sample(job, es, logits, first_row)) for job, es in sampling])))
        for job, entries in by_job.items():
            samples = draws.get(job, [])
            for e in entries:  # rejected drafts' K/V doesn't count; the newest token has none yet
                e.seq.wrote_kv(e.end - e.rows + (len(samples) if e.rows else 0))
            if entries[0].drafts:
                self._count_drafts(job, entries[0], len(samples) - 1)
            if samples:
                e = entries[0]
                rows = [logits[first_row[e] + i] for i in range(len(samples))] if job.return_logits else None
                result = job.accept_tokens(samples, rows)
                self.counters.tokens_generated_total += len(result["token_ids"])
            elif job.new_tokens == 0:
                result = job.prefill_result()
            else:
                result = None  # a resumed job refilling lost K/V: nothing to report until it samples again
            for seq in job.seqs:
                draft_len = seq.draft_kv_len if self.drafter is not None and seq is job.seq else 0
                self.pagetable.written(seq.pages, seq.tokens, min(seq.kv_len, job.stable_len(seq)), draft_len)
            if result is None:
                continue
            results.append(result)
            if result.get("eos"):
                self._end(job)

    def _sample(self, job: DynamicJob, entries: list[ScheduledSeq], logits, first_row: dict) -> list:
        """The job's draws from its rows of this step's logits (engine.sampling.draw)."""
        if job.cfg:  # entries: the positive and the negative sequence, one row each
            pos, neg = (logits[first_row[e]] for e in entries)
            return draw_cfg(job.sampler, pos, neg, job.gen_settings.cfg_scale, job.seq.tokens,
                            job.return_top_tokens, job.blocked_tokens())
        e = entries[0]
        rows = [logits[first_row[e] + i] for i in range(e.rows)]
        return draw_verified(job.sampler, rows, e.drafts, job.seq.tokens, job.return_top_tokens,
                             lambda i: job.blocked_tokens(offset=i))

    def _filter_pool(self) -> ThreadPoolExecutor:
        if self._filter_executor is None:
            self._filter_executor = ThreadPoolExecutor(1, thread_name_prefix="pagedeck-filters")
        return self._filter_executor

    def _count_drafts(self, job: DynamicJob, e: ScheduledSeq, accepted: int) -> None:
        c = self.counters
        c.drafts_total += 1
        job.accepted_draft_tokens += accepted
        job.rejected_draft_tokens += len(e.drafts) - accepted
        c.drafted_tokens_total += len(e.drafts)
        c.accepted_tokens_total += accepted
        for i in range(accepted):
            c.accepted_per_position[i] += 1
        if self.drafter is not None:  # draft K/V stays valid for the drafts that were accepted
            e.seq.wrote_draft_kv(e.start + 1 + min(accepted, len(e.drafts) - 1))

    def _plan(self) -> list[ScheduledSeq]:
        """What each active sequence feeds this step: a prefill chunk, or its last token (plus drafts)."""
        plan: list[ScheduledSeq] = []
        budget = self.max_chunk_size
        if self.step_budget is not None:
            waiting = sum(max(0, s.fill_len - 1 - s.kv_len) for job in self.active if job.prefilling for s in job.seqs)
            budget = self.step_budget.tokens(self._shielded(), waiting)
        ps = self.page_size
        decoding = []
        for job in self.active:
            if job.prefilling:
                for seq in job.seqs:
                    start, last = seq.kv_len, seq.fill_len - 1
                    if start >= last or budget <= 0:
                        continue
                    end = min(last, start + budget)
                    if end < last and (end // ps) * ps > start:
                        end = (end // ps) * ps  # chunks end on page boundaries
                    if job.embeddings and self.model.bidirectional_images:
                        end = min(last, chunk_end(seq.tokens, start, end, last))  # an image in one step
                    final = end == last and not job.cfg  # the last prompt token rides along and is sampled
                    toks = seq.tokens[start : seq.fill_len] if final else seq.tokens[start:end]
                    plan.append(ScheduledSeq(job, seq, toks, start, int(final), prefill=True))
                    budget -= len(toks)
            elif job.cfg:
                plan += [ScheduledSeq(job, seq, seq.tokens[-1:], len(seq.tokens) - 1, 1) for seq in job.seqs]
            else:
                decoding.append(job)
        drafts = self._draft(decoding)
        for job, d in zip(decoding, drafts):
            seq = job.seq
            plan.append(ScheduledSeq(job, seq, seq.tokens[-1:] + d, len(seq.tokens) - 1, 1 + len(d), drafts=tuple(d)))
        # Sequences with the same adapter set side by side: the LoRA step sees one segment per set.
        first: dict[bytes, int] = {}
        return sorted(plan, key=lambda e: first.setdefault(e.job.lora_root, len(first)))

    def _shielded(self) -> int:
        """Decoding jobs the step budget protects from the prefills: those whose first token came before the
        oldest prefilling job was queued. Eight chats sent at once are all prefilled at full speed (the first
        to finish would otherwise slow the others' prompts to a fair share, and the eight would decode in two
        smaller batches); a paste arriving while chats stream is shared with them."""
        arrived = min((job.time_enqueue for job in self.active if job.prefilling), default=None)
        if arrived is None:
            return sum(not job.prefilling for job in self.active)
        return sum(not job.prefilling and job.time_first_token < arrived for job in self.active)

    def _draft(self, jobs: list[DynamicJob]) -> list[list[int]]:
        """Draft tokens per decoding job, or none when speculation is off or the batch is too large to gain."""
        if not jobs or (self.drafter is None and not self.use_ngram_draft) or len(jobs) > self.max_draft_batch_size:
            return [[] for _ in jobs]
        # Filtered jobs don't draft: their grammar state can't follow tokens that may be rejected. Jobs with
        # images don't take a draft model's drafts: it would read their placeholders as tokens it never saw.
        no_draft = (lambda job: job.filters or job.embeddings) if self.drafter is not None else (lambda job: job.filters)
        wants = [(job, 0 if no_draft(job) else max(0, min(self.num_draft_tokens, job.max_new_tokens - job.new_tokens - 1)))
                 for job in jobs]
        wants = [(job, self.growth.grow_for_drafts(job, k) if k else 0) for job, k in wants]
        if self.drafter is not None:
            return self.drafter.draft([(job.seq, k) for job, k in wants])
        return [no_placeholders(job.ngram.propose(job.seq.tokens, k)) if k else [] for job, k in wants]

    def _end(self, job: DynamicJob) -> None:
        for seq in job.seqs:
            self.pagetable.release(seq.pages, job.serial)
        self.active.remove(job)
        self.job_preemptions.ended(job)
        self._collect_adapters()

    def _collect_adapters(self) -> None:
        """Drop adapters being unloaded once no queued or running job uses them."""
        if self.adapters.unloading:
            self.adapters.collect(self._adapters_in_use())

    def _adapters_in_use(self) -> set[int]:
        return {id(lora) for job in itertools.chain(self.pending, self.active) for lora, _ in job.loras}

    # ---- cache management -------------------------------------------------------------------------
    def defrag_cache(self) -> None:
        """Lay cached prefix chains out contiguously once the queue drains (skipped if <= 10% would move)."""
        order = self.pagetable.defrag_order()
        if order is not None:
            for cache in (self.cache, self.draft_cache):
                if cache is not None:
                    cache.permute(order)
            self.pagetable.apply_order(order)

    def _copy_page(self, src: int, dst: int, n: int) -> None:
        self.pagetable.copy_fn(src, dst, n)

    def reset_page_table(self) -> None:
        """Forget the prompt cache."""
        if self.num_remaining_jobs():
            raise RuntimeError("reset_page_table() needs an empty queue")
        self.pagetable.reset()

    # ---- LoRA adapters (engine/generator/adapters.py) ---------------------------------------------
    def load_lora(self, lora: Any, name: str | None = None) -> Any:
        """Load a PEFT adapter folder (or register a LoRA object) for jobs to name; returns its LoRA.

        Loading the same adapter under the same name again returns the loaded one; another adapter under a
        loaded name is refused. Jobs pick adapters with DynamicJob(..., loras=[(lora_or_name, scale), ...])."""
        return self.adapters.load(lora, name)

    def unload_lora(self, lora: Any) -> bool:
        """Unload an adapter (a LoRA or its name). New jobs naming it are refused from now on; queued and
        running jobs that use it finish first (as vLLM lets in-flight requests finish). Returns True if it
        is gone now, False if it goes when its last job ends (DynamicGeneratorAsync.unload_lora waits)."""
        return self.adapters.unload(lora, self._adapters_in_use())

    @property
    def loras(self) -> list:
        """The default set's adapters (set_loras)."""
        return [lora for lora, _ in self.adapters.default]

    def set_loras(self, loras: Any, scales: Any = None) -> None:
        """Set the default adapters, used by jobs that name none (exllamav2's set_loras); only while no job is
        queued or running. Paths are loaded into this generator (load_lora) on the way. The set belongs to
        the generator, not the shared model; pages computed under it are never reused under another."""
        if self.num_remaining_jobs():
            raise RuntimeError("LoRAs cannot be changed while there are jobs in the generator queue")
        self.adapters.set_default(loras, scales)  # validates everything before anything changes

    def warmup(self) -> None:
        """Run a short generation so first-request latency doesn't pay for lazy initialisation."""
        self.generate("Once upon a time,", max_new_tokens=32, gen_settings=SamplerSettings.greedy())
        self.reset_page_table()

    # ---- inspection -------------------------------------------------------------------------------
    def metrics(self) -> Metrics:
        """A cheap snapshot for dashboards (keys: engine.contract.Metrics); safe to call from any thread
        while iterate() runs."""
        states, shared = self.pagetable.states()
        free, cached = states.count(FREE), states.count(CACHED)
        ids = self.adapters.root_ids
        page_adapters = [-1 if p.root is None else ids.get(p.root, -1) for p in list(self.pagetable.pages)]
        set_labels = self.adapters.root_labels
        d = self.counters.snapshot()
        pending = list(self.pending)
        d.update(
            pages_total=len(states),
            pages_referenced=len(states) - free - cached,
            pages_cached=cached,
            pages_free=free,
            page_states=states,
            page_shared=shared,
            page_size=self.page_size,
            page_owner_identifiers={j.serial: j.identifier for j in list(self.active) + pending},
            preempted_pages=preempted_pages(pending),
            job_preemptions=self.job_preemptions.snapshot(list(self.active) + pending),
            active_jobs=len(self.active),
            pending_jobs=len(self.pending),
            deferred_jobs=0,
            sampling_threads_max=self.sampling_pool.max_threads,
            loras=[lora.name for lora in self.loras],
            loras_loaded=list(self.adapters.loaded),
            page_adapters=page_adapters,
            adapter_sets={i: list(set_labels[i]) for i in set(page_adapters) if i >= 0},
            experts=self.experts.snapshot(),
        )
        return d

    # ---- blocking convenience API -----------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str],
        max_new_tokens: int = 200,
        min_new_tokens: int = 0,
        seed: int | None = None,
        gen_settings: SamplerSettings | None = None,
        encode_special_tokens: bool = False,
        decode_special_tokens: bool = False,
        stop_conditions: list[int | str] | None = None,
        add_bos: bool = False,
        abort_event: Any = None,
        completion_only: bool = False,
        return_last_results: bool = False,
        **advanced: Any,
    ) -> str | list[str] | tuple:
        """Generate for one prompt or a batch of prompts, blocking until all are done."""
        single = isinstance(prompt, str)
        prompts = [prompt] if single else list(prompt)
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompt must be a string or a non-empty list of strings")
        jobs = [DynamicJob(self.tokenizer.encode(p, add_bos=add_bos, encode_special_tokens=encode_special_tokens),
                           max_new_tokens, min_new_tokens=min_new_tokens, gen_settings=gen_settings,
                           seed=None if seed is None else seed + i, stop_conditions=stop_conditions,
                           decode_special_tokens=decode_special_tokens, identifier=i, **advanced)
                for i, p in enumerate(prompts)]
        self.enqueue(jobs)
        completions = [""] * len(jobs)
        last: list[dict | None] = [None] * len(jobs)
        try:
            while any(last[i] is None for i in range(len(jobs))):
                if abort_event is not None and abort_event.is_set():
                    break
                for r in self.iterate():
                    if r["stage"] == "streaming":
                        completions[r["identifier"]] += r["text"]
                        if r["eos"]:
                            last[r["identifier"]] = r
        finally:
            for job in jobs:
                if job in self.pending or job in self.active:
                    self.cancel(job)
        texts = [c if completion_only else p + c for p, c in zip(prompts, completions)]
        out: Any = texts[0] if single else texts
        if return_last_results:
            return out, (last[0] if single else last)
        return out


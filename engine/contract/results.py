"""The dicts the generator hands out: iterate()/async results per stage, and the metrics() snapshot.

TypedDicts, so consumers (the app, the CLI, benchmarks) read documented keys instead of guessing, and a
test holds the generator to them (tests/engine/test_contract.py). Names follow ExLlamaV2's.
"""
from __future__ import annotations

from typing import Any, Literal, TypedDict, Union, get_args

Stage = Literal["deferred", "started", "prefill", "streaming"]
EosReason = Literal["stop_token", "stop_string", "max_new_tokens", "end_filter", "cancelled", "repetition"]
# "repetition": the job ran with stop_on_loops and its reply was repeating itself (engine/generator/loops.py)
STAGES: tuple[str, ...] = get_args(Stage)
EOS_REASONS: tuple[str, ...] = get_args(EosReason)

FREE, CACHED = -2, -1  # metrics()["page_states"] codes of pages nobody references (owners are serials >= 0)


class _Result(TypedDict):
    job: Any  # the DynamicJob
    serial: int | None  # None only while "deferred" (not enqueued yet)
    identifier: Any  # the job's identifier, as given
    stage: Stage


class DeferredResult(_Result):
    """DynamicJobAsync only: held back until a pending LoRA swap is done."""

    eos: bool  # always False
    pending_loras: Any


class StartedResult(_Result):
    cached_tokens: int  # prompt tokens found in the prefix cache
    cached_pages: int
    prompt_tokens: int
    loras: list[tuple[str, float]]  # (name, scale) of each LoRA adapter the job runs; [] for the base model


class PrefillResult(_Result):
    curr_progress: int  # prompt tokens whose K/V is written so far
    max_progress: int


class _Streaming(_Result):
    text: str
    token_ids: list[int]
    eos: bool


class StreamingResult(_Streaming, total=False):
    """One step's new text; with eos=True the job's last result, carrying its summary."""

    token_probs: list[float]  # return_probs
    top_k_tokens: list[list[int]]  # return_top_tokens
    top_k_probs: list[list[float]]
    logits: Any  # return_logits: (n, vocab) float32 tensor
    suppressed_tokens: list[int]  # a banned string was rewound
    suppressed_text: str
    eos_reason: EosReason
    eos_triggering_token_id: int
    eos_triggering_token_str: str
    eos_triggering_string: str
    full_completion: str
    new_tokens: int
    prompt_tokens: int
    time_enqueued: float
    time_prefill: float
    time_generate: float
    cached_pages: int
    cached_tokens: int
    accepted_draft_tokens: int
    rejected_draft_tokens: int
    held: dict  # {"text": text held back for a possible stop string when the job ended}
    loras: list[tuple[str, float]]  # on eos: the job's adapters and scales, as in "started"


Result = Union[DeferredResult, StartedResult, PrefillResult, StreamingResult]


class Metrics(TypedDict):
    """generator.metrics(): a cheap snapshot, safe from any thread. Counters are raw and monotonic;
    consumers derive rates."""

    pages_total: int
    pages_referenced: int
    pages_cached: int
    pages_free: int
    page_states: list[int]  # per page: first owner's serial, CACHED or FREE
    page_shared: list[bool]  # referenced by several jobs (prefix sharing)
    page_owner_identifiers: dict[int, Any]  # serial -> identifier of every queued or running job
    preempted_pages: dict[int, int]  # page -> serial of the preempted (queued) job whose K/V it still caches
    page_size: int
    active_jobs: int
    pending_jobs: int
    deferred_jobs: int  # held back by DynamicGeneratorAsync for a LoRA swap (0 from the sync generator)
    batch_size: int  # sequences in the last step
    batch_size_peak: int  # largest batch_size so far (a scrape every few seconds misses short peaks)
    prefill_tokens_step: int
    decode_tokens_step: int
    tokens_generated_total: int
    prefill_tokens_total: int
    prefix_hit_tokens_total: int
    prompt_tokens_total: int  # prompt tokens of admitted jobs (cached or not): prefix-cache queries
    steps_total: int
    time_total_s: float  # time spent inside iterate()
    step_host_overhead_s: float  # the last step's time outside model.forward
    drafted_tokens_total: int
    accepted_tokens_total: int
    drafts_total: int  # draft proposals (one per job per drafting step)
    accepted_per_position: list[int]
    preemptions_total: int  # running jobs that gave their pages back because the cache ran out of pages
    resumes_total: int  # preempted jobs admitted again (their output goes on exactly)
    recomputed_tokens_total: int  # K/V tokens lost to preemption (evicted meanwhile) and computed again
    job_preemptions: dict[int, dict]  # serial -> identifier, preemptions, resumes, recomputed_tokens of each
    # preempted job (queued, running, or among the last that ended)
    sampling_threads_busy: int
    sampling_threads_max: int
    loras: list[str]  # the default set's adapter names (set_loras)
    loras_loaded: list[str]  # every adapter loaded into the generator (load_lora / set_loras)
    page_adapters: list[int]  # per page: id (in adapter_sets) of the adapter set its K/V was computed under; -1 free
    adapter_sets: dict[int, list[tuple[str, float]]]  # id -> (name, scale) pairs, for the ids in page_adapters; 0: []
    experts: dict | None  # a mixture-of-experts model's expert counts over its last steps (expert_stats); None: dense
    snapshot_time: float  # time.monotonic()


METRICS_KEYS: tuple[str, ...] = tuple(Metrics.__annotations__)

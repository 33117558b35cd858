"""/metrics: the generator's counters in Prometheus text format under vLLM's names, plus pagedeck's own.

Where a vLLM metric means the same thing it keeps vLLM's name (and its `model_name` label), so a
Grafana board or client built for vLLM reads pagedeck unchanged; what vLLM has no word for is
`pagedeck:*`. Values are read from generator.metrics() at scrape time (a custom collector), so nothing
is double-counted and the server adds no work per step. The registry is per server, never the global one.
A server over a model pool labels every model's samples with its `model_name` and adds the pool's state
(which models are loaded, their memory, loads and unloads, the budget).
"""
from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# vLLM's buckets for time_to_first_token_seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


class GeneratorCollector:
    """Turns metrics() snapshots into metric families at each scrape: one sample per served model."""

    def __init__(self, source: Callable[[], list[tuple[dict, str, dict]]]):
        self.source = source  # () -> [(generator.metrics(), model name, server stats)], one per loaded model

    def describe(self) -> list:
        return []  # values depend on the served models: collected only at scrape time

    def collect(self):
        got = self.source()
        if not got:
            return
        labels = ["model_name"]

        def family(kind, metric: str, doc: str, value: Callable[[dict, dict], float]):
            f = kind(metric, doc, labels=labels)
            for m, name, server in got:
                f.add_metric([name], float(value(m, server)))
            return f

        def gauge(metric: str, doc: str, value: Callable[[dict, dict], float]):
            return family(GaugeMetricFamily, metric, doc, value)

        def counter(metric: str, doc: str, value: Callable[[dict, dict], float]):
            return family(CounterMetricFamily, metric, doc, value)

        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent (pages referenced by jobs)",
                    lambda m, s: m["pages_referenced"] / (m["pages_total"] or 1))
        yield gauge("vllm:num_requests_running", "Jobs in the running batch (API requests and chats)",
                    lambda m, s: m["active_jobs"])
        yield gauge("vllm:num_requests_waiting", "Jobs queued or deferred for a default LoRA swap",
                    lambda m, s: m["pending_jobs"] + m["deferred_jobs"])
        for metric, doc, key in (
                ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", "prompt_tokens_total"),
                ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", "prefix_hit_tokens_total"),
                ("vllm:prompt_tokens", "Prompt tokens of admitted jobs", "prompt_tokens_total"),
                ("vllm:generation_tokens", "Generated tokens", "tokens_generated_total"),
                ("vllm:num_preemptions", "Running jobs that gave their pages back (the cache ran dry) and resumed later",
                 "preemptions_total"),
                ("vllm:spec_decode_num_drafts", "Draft proposals (one per job per drafting step)", "drafts_total"),
                ("vllm:spec_decode_num_draft_tokens", "Drafted tokens", "drafted_tokens_total"),
                ("vllm:spec_decode_num_accepted_tokens", "Accepted draft tokens", "accepted_tokens_total")):
            yield counter(metric, doc, lambda m, s, key=key: m[key])
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted draft tokens by position in the draft", labels=labels + ["position"])
        for m, name, _ in got:
            for i, v in enumerate(m["accepted_per_position"]):
                per_pos.add_metric([name, str(i)], float(v))
        yield per_pos
        for key, doc in (("pages_total", "Cache pages"), ("pages_referenced", "Pages referenced by running jobs"),
                         ("pages_cached", "Unreferenced pages kept as prompt cache"), ("pages_free", "Free pages"),
                         ("batch_size", "Sequences in the last step"),
                         ("batch_size_peak", "Largest batch of any step so far"),
                         ("sampling_threads_busy", "Sampling threads busy in the last step"),
                         ("sampling_threads_max", "Sampling thread pool size")):
            yield gauge(f"pagedeck:{key}", doc, lambda m, s, key=key: m[key])
        yield gauge("pagedeck:page_size", "Tokens per cache page", lambda m, s: m.get("page_size", 0))
        yield gauge("pagedeck:jobs_deferred", "Jobs held back for a LoRA swap", lambda m, s: m["deferred_jobs"])
        yield counter("pagedeck:steps", "Generator steps", lambda m, s: m["steps_total"])
        yield gauge("pagedeck:api_requests_running", "API requests being answered", lambda m, s: s["running"])
        yield counter("pagedeck:api_requests", "API requests answered or being answered", lambda m, s: s["total"])


class PoolCollector:
    """The model pool's state (python -m engine serve): every model it knows, loaded or not, and its budget."""

    def __init__(self, pool: Any):
        self.pool = pool  # engine.server.models_pool.ModelPool

    def describe(self) -> list:
        return []

    def collect(self):
        models = list(self.pool.models.values())
        loaded = GaugeMetricFamily("pagedeck:model_loaded", "1 when the model is loaded, else 0",
                                   labels=["model_name"])
        memory = GaugeMetricFamily("pagedeck:model_memory_bytes", "Memory the model counts against the budget "
                                   "(the engine's estimate of its weights, cache and activations)",
                                   labels=["model_name"])
        loads = CounterMetricFamily("pagedeck:model_loads", "Times the model was loaded", labels=["model_name"])
        unloads = CounterMetricFamily("pagedeck:model_unloads", "Times the model was unloaded (idle or evicted)",
                                      labels=["model_name"])
        for e in models:
            loaded.add_metric([e.name], 1.0 if e.served is not None else 0.0)
            memory.add_metric([e.name], float(e.charge))
            loads.add_metric([e.name], float(e.loads))
            unloads.add_metric([e.name], float(e.unloads))
        yield from (loaded, memory, loads, unloads)
        yield GaugeMetricFamily("pagedeck:memory_used_bytes", "Memory the loaded models count against the budget",
                                value=float(self.pool.used_bytes()))
        if self.pool.budget is not None:
            yield GaugeMetricFamily("pagedeck:memory_budget_bytes", "The memory budget of loaded models",
                                    value=float(self.pool.budget))


def build_registry(source: Callable[[], Any], pool: Any = None) -> tuple[CollectorRegistry, Histogram]:
    """A private registry with the generator collector (and the pool's, when there is one) and the TTFT
    histogram the server observes."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GeneratorCollector(source))
    if pool is not None:
        registry.register(PoolCollector(pool))
    ttft = Histogram("vllm:time_to_first_token_seconds", "Time from request to first token (API requests)",
                     labelnames=["model_name"], buckets=TTFT_BUCKETS, registry=registry)
    return registry, ttft

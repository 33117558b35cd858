"""/metrics: the generator's counters in Prometheus text format under vLLM's names, plus pagedeck's own.

Where a vLLM metric means the same thing it keeps vLLM's name (and its `model_name` label), so a
Grafana board or client built for vLLM reads pagedeck unchanged; what vLLM has no word for is
`pagedeck:*`. Values are read from generator.metrics() at scrape time (a custom collector), so nothing
is double-counted and the server adds no work per step. The registry is per server, never the global one.
"""
from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# vLLM's buckets for time_to_first_token_seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


class GeneratorCollector:
    """Turns one metrics() snapshot into metric families at each scrape."""

    def __init__(self, source: Callable[[], tuple[dict, str, dict] | None]):
        self.source = source  # () -> (generator.metrics(), model name, server stats) or None when no model

    def describe(self) -> list:
        return []  # values depend on the served model: collected only at scrape time

    def collect(self):
        got = self.source()
        if got is None:
            return
        m, name, server = got
        labels = ["model_name"]
        values = [name]

        def gauge(metric: str, doc: str, value: float):
            g = GaugeMetricFamily(metric, doc, labels=labels)
            g.add_metric(values, float(value))
            return g

        def counter(metric: str, doc: str, value: float):
            c = CounterMetricFamily(metric, doc, labels=labels)
            c.add_metric(values, float(value))
            return c

        total = m["pages_total"] or 1
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent (pages referenced by jobs)",
                    m["pages_referenced"] / total)
        yield gauge("vllm:num_requests_running", "Jobs in the running batch (API requests and chats)",
                    m["active_jobs"])
        yield gauge("vllm:num_requests_waiting", "Jobs queued, deferred for a LoRA swap, or waiting for one",
                    m["pending_jobs"] + m["deferred_jobs"] + server["adapter_waiting"])
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                      m["prompt_tokens_total"])
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache",
                      m["prefix_hit_tokens_total"])
        yield counter("vllm:prompt_tokens", "Prompt tokens of admitted jobs", m["prompt_tokens_total"])
        yield counter("vllm:generation_tokens", "Generated tokens", m["tokens_generated_total"])
        yield counter("vllm:spec_decode_num_drafts", "Draft proposals (one per job per drafting step)",
                      m["drafts_total"])
        yield counter("vllm:spec_decode_num_draft_tokens", "Drafted tokens", m["drafted_tokens_total"])
        yield counter("vllm:spec_decode_num_accepted_tokens", "Accepted draft tokens", m["accepted_tokens_total"])
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted draft tokens by position in the draft", labels=labels + ["position"])
        for i, v in enumerate(m["accepted_per_position"]):
            per_pos.add_metric(values + [str(i)], float(v))
        yield per_pos
        for key, doc in (("pages_total", "Cache pages"), ("pages_referenced", "Pages referenced by running jobs"),
                         ("pages_cached", "Unreferenced pages kept as prompt cache"), ("pages_free", "Free pages"),
                         ("batch_size", "Sequences in the last step"),
                         ("batch_size_peak", "Largest batch of any step so far"),
                         ("sampling_threads_busy", "Sampling threads busy in the last step"),
                         ("sampling_threads_max", "Sampling thread pool size")):
            yield gauge(f"pagedeck:{key}", doc, m[key])
        yield gauge("pagedeck:page_size", "Tokens per cache page", m.get("page_size", 0))
        yield gauge("pagedeck:jobs_deferred", "Jobs held back for a LoRA swap", m["deferred_jobs"])
        yield counter("pagedeck:steps", "Generator steps", m["steps_total"])
        yield gauge("pagedeck:api_requests_running", "API requests being answered", server["running"])
        yield counter("pagedeck:api_requests", "API requests answered or being answered", server["total"])


def build_registry(source: Callable[[], Any]) -> tuple[CollectorRegistry, Histogram]:
    """A private registry with the generator collector and the TTFT histogram the server observes."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GeneratorCollector(source))
    ttft = Histogram("vllm:time_to_first_token_seconds", "Time from request to first token (API requests)",
                     labelnames=["model_name"], buckets=TTFT_BUCKETS, registry=registry)
    return registry, ttft

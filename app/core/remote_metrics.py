"""A remote server's Prometheus /metrics -> the dashboard's snapshot dict (generator.metrics()'s keys).

The dashboard draws the same charts for a remote as for the local generator. Each key is filled from
the first metric name a server exposes for that meaning: vLLM's (`vllm:*`, which pagedeck's server also
uses), SGLang's (`sglang:*`) and llama-server's (`llamacpp:*`); what a server doesn't report is None and
its chart says "no source". Page-level data exists only for pagedeck servers (GET /pagedeck/pages);
elsewhere the page map becomes a KV-usage bar (`kv_usage`, a fraction).

A server holding several models (a pagedeck model pool, vLLM with several engines) labels each model's
samples with `model_name`: `served_models` lists them in the server's order and a snapshot may keep only
one model's samples (the dashboard's model picker), as it keeps the local generators apart.
"""
from __future__ import annotations

import time
from typing import Iterable

from prometheus_client.parser import text_string_to_metric_families

from engine.contract import METRICS_KEYS

# dashboard key -> sample names, first present wins; values are summed over label sets (engines, models).
COUNTS = {
    "active_jobs": ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing"),
    "pending_jobs": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"),
    "deferred_jobs": ("pagedeck:jobs_deferred",),
    "batch_size": ("pagedeck:batch_size", "llamacpp:n_busy_slots_per_decode", "vllm:num_requests_running",
                   "sglang:num_running_reqs"),
    "tokens_generated_total": ("vllm:generation_tokens_total", "sglang:generation_tokens_total",
                               "llamacpp:tokens_predicted_total"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total", "llamacpp:prompt_tokens_total"),
    "drafted_tokens_total": ("vllm:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_draft_tokens_total"),
    "accepted_tokens_total": ("vllm:spec_decode_num_accepted_tokens_total",
                              "llamacpp:spec_decode_num_accepted_tokens_total"),
    "prefix_hit_tokens_total": ("vllm:prefix_cache_hits_total",),
    "prefix_queries_total": ("vllm:prefix_cache_queries_total",),
    "steps_total": ("pagedeck:steps_total", "llamacpp:n_decode_total"),
    "pages_total": ("pagedeck:pages_total",),
    "pages_referenced": ("pagedeck:pages_referenced",),
    "pages_cached": ("pagedeck:pages_cached",),
    "pages_free": ("pagedeck:pages_free",),
    "sampling_threads_busy": ("pagedeck:sampling_threads_busy",),
    "sampling_threads_max": ("pagedeck:sampling_threads_max",),
}
# Fractions in [0, 1]: the largest over label sets (several engines: the fullest one matters).
FRACTIONS = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                 "llamacpp:kv_cache_usage_ratio"),
    "acceptance_gauge": ("sglang:spec_accept_rate",),
    "prefix_hit_rate_gauge": ("sglang:cache_hit_rate",),
}
SERVERS = (("pagedeck:", "pagedeck"), ("vllm:", "vLLM"), ("sglang:", "SGLang"), ("llamacpp:", "llama.cpp"))


def parse_samples(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text -> {sample name: [(labels, value)]}; ValueError on text that isn't Prometheus."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def served_models(samples: dict) -> list[str]:
    """The `model_name`s a server reports its running requests under, in its order (one model: [name])."""
    for name in COUNTS["active_jobs"]:
        if name in samples:
            return list(dict.fromkeys(labels["model_name"] for labels, _ in samples[name] if "model_name" in labels))
    return []


def only_model(samples: dict, model: str) -> dict:
    """The samples of one model: those labelled with its model_name, and those labelled with none."""
    out = {}
    for name, values in samples.items():
        kept = [(labels, v) for labels, v in values if labels.get("model_name", model) == model]
        if kept:
            out[name] = kept
    return out


def _first(samples: dict, names: Iterable[str], combine) -> float | None:
    for name in names:
        if name in samples:
            return combine(v for _, v in samples[name])
    return None


def server_kind(samples: dict) -> str:
    for prefix, kind in SERVERS:
        if any(name.startswith(prefix) for name in samples):
            return kind
    return "unknown"


def snapshot_from_metrics(text: str, pages: dict | None = None, now: float | None = None,
                          model: str | None = None) -> dict:
    """The dashboard snapshot for a remote: None where the server reports nothing for a key. `model`: that
    model's samples only (None: every model's, summed); `pages` must then be that model's page map."""
    samples = parse_samples(text)
    if model is not None:
        samples = only_model(samples, model)
    snap: dict = dict.fromkeys(METRICS_KEYS)  # every key the dashboard reads; None = no source
    snap.update({key: _first(samples, names, sum) for key, names in COUNTS.items()})
    snap.update({key: _first(samples, names, max) for key, names in FRACTIONS.items()})
    for key in ("active_jobs", "pending_jobs", "deferred_jobs", "batch_size", "pages_total", "pages_referenced",
                "pages_cached", "pages_free", "sampling_threads_busy", "sampling_threads_max"):
        if snap[key] is not None:
            snap[key] = int(snap[key])
    per_pos = sorted(((int(labels.get("position", 0)), v) for labels, v in
                      samples.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", [])))
    snap["accepted_per_position"] = [v for _, v in per_pos]
    snap["prefill_tokens_step"] = snap["decode_tokens_step"] = None
    snap["loras"] = _loras(samples, pages)
    snap.update(page_states=[], page_shared=[], page_owner_identifiers={})
    if pages:
        snap.update(page_states=list(pages.get("page_states", [])), page_shared=list(pages.get("page_shared", [])),
                    page_owner_identifiers=dict(pages.get("page_owner_identifiers", {})),
                    page_size=pages.get("page_size"), page_adapters=pages.get("page_adapters"),
                    loras_loaded=pages.get("loras_loaded"))
        if "adapter_sets" in pages:  # JSON keys are strings
            snap["adapter_sets"] = {int(k): [tuple(p) for p in v] for k, v in pages["adapter_sets"].items()}
    if snap["kv_usage"] is None and snap["pages_total"]:
        snap["kv_usage"] = snap["pages_referenced"] / snap["pages_total"]
    snap["server"] = server_kind(samples)
    snap["snapshot_time"] = time.monotonic() if now is None else now
    return snap


def _loras(samples: dict, pages: dict | None) -> list[str] | None:
    if pages and "loras" in pages:
        return list(pages["loras"])
    info = samples.get("vllm:lora_requests_info")
    if not info:
        return None
    labels, _ = max(info, key=lambda lv: lv[1])  # the value is the time of the latest update
    return [a for a in labels.get("running_lora_adapters", "").split(",") if a]

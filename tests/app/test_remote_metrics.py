"""Remote /metrics -> dashboard: every server's names map to the same snapshot; missing ones say so.

pagedeck's text comes from a real server; vLLM's from a real vLLM CPU run (tests/data, captured with
`curl /metrics` during generation); SGLang's and llama-server's are written from their metric names
(neither runs on this machine). The dashboard is a real widget fed those snapshots.
"""
from pathlib import Path

import pytest

from app.core.remote_metrics import parse_samples, snapshot_from_metrics
from tests.server_support import ServerThread
from tests.app.test_dashboard import dock  # noqa: F401 - the real dashboard widget fixture

DATA = Path(__file__).parents[1] / "data"

SGLANG = """# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.25
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 2.0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.5
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{model_name="m"} 0.75
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="m"} 41.0
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{model_name="m"} 1200.0
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{model_name="m"} 800.0
"""

LLAMA_SERVER = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 2000
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 640
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 300
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 2.5
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 3
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""


def test_sglang_names_fill_the_snapshot_and_leave_the_rest_unreported():
    snap = snapshot_from_metrics(SGLANG, now=1.0)
    assert snap["server"] == "SGLang"
    assert (snap["active_jobs"], snap["pending_jobs"], snap["batch_size"]) == (3, 2, 3)
    assert snap["kv_usage"] == 0.25 and snap["acceptance_gauge"] == 0.75 and snap["prefix_hit_rate_gauge"] == 0.5
    assert snap["tokens_generated_total"] == 1200 and snap["prompt_tokens_total"] == 800
    assert snap["pages_total"] is None and snap["page_states"] == [] and snap["sampling_threads_busy"] is None
    assert snap["drafted_tokens_total"] is None and snap["loras"] is None


def test_llama_server_names_fill_the_snapshot():
    snap = snapshot_from_metrics(LLAMA_SERVER, now=1.0)
    assert snap["server"] == "llama.cpp"
    assert (snap["active_jobs"], snap["pending_jobs"]) == (3, 1)
    assert snap["batch_size"] == 2  # n_busy_slots_per_decode: sequences per decode, as an int
    assert snap["tokens_generated_total"] == 640 and snap["steps_total"] == 300
    assert snap["kv_usage"] is None  # recent llama-server reports no KV usage: no bar, the map says so


def test_real_vllm_metrics_parse():
    text = (DATA / "vllm_metrics.txt").read_text()
    snap = snapshot_from_metrics(text, now=1.0)
    assert snap["server"] == "vLLM"
    assert snap["active_jobs"] >= 1 and snap["kv_usage"] > 0 and snap["tokens_generated_total"] > 0
    assert snap["prefix_hit_tokens_total"] is not None and snap["pages_total"] is None
    assert "vllm:kv_cache_usage_perc" in parse_samples(text)


def test_pagedeck_server_metrics_and_page_map_round_trip(tiny_llama_folder):
    import json
    import urllib.request

    with ServerThread(tiny_llama_folder) as server:
        client = server.client()
        client.chat.completions.create(model=server.model_name, max_tokens=5,
                                       messages=[{"role": "user", "content": "hi"}])
        with urllib.request.urlopen(server.url + "/metrics") as r:
            text = r.read().decode()
        with urllib.request.urlopen(server.url + "/pagedeck/pages") as r:
            pages = json.loads(r.read())
        local = server.snapshot()
    snap = snapshot_from_metrics(text, pages, now=1.0)
    assert snap["server"] == "pagedeck"
    for key in ("pages_total", "pages_cached", "pages_free", "tokens_generated_total", "steps_total",
                "prefix_hit_tokens_total", "sampling_threads_max", "deferred_jobs"):
        assert snap[key] == local[key], key
    assert snap["page_states"] == local["page_states"] and snap["loras"] == []
    assert snap["kv_usage"] == 0 and snap["active_jobs"] == 0


def test_dashboard_draws_a_kv_bar_and_says_which_charts_have_no_source(dock):
    dock.push(snapshot_from_metrics(SGLANG, now=1.0))
    dock.push(snapshot_from_metrics(SGLANG.replace("1200.0", "1300.0"), now=2.0))
    assert dock.kv_bar.isVisible() and not dock.page_map.isVisible() and dock.kv_bar.value() == 250
    shown = {k for k, item in dock.no_source.items() if item.isVisible()}
    assert shown == {"sampling"}  # SGLang reports usage, jobs, tokens and acceptance, not sampling threads
    assert dock.tokens_per_second == pytest.approx(100.0)
    assert dock.series.column("acceptance_pct")[-1] == 75.0 and dock.series.column("referenced_pct")[-1] == 25.0
    assert "n/a" in dock.pages_label.text() and "25.0 %" in dock.pages_label.text()
    assert "hit rate: 50.0 %" in dock.cache_label.text() and "75.0 %" in dock.acceptance_label.text()
    dock.reset()
    dock.push(snapshot_from_metrics(LLAMA_SERVER, now=3.0))
    shown = {k for k, item in dock.no_source.items() if item.isVisible()}
    assert shown == {"occupancy", "acceptance", "sampling"}
    assert "no source" in dock.acceptance_label.text() and "n/a" in dock.sampling_label.text()

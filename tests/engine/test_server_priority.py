"""The request's `priority` (vLLM's): when two streams can't both fit in the cache, the worse-ranked one gives
its pages back and resumes later, and both replies equal their solo runs; a non-integer priority is a 400.

Arrival is pinned by holding the generator's worker while the requests come in, and the coroutine run on the
server's loop after each arrival makes sure the handler has queued its job before the next request is sent.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.engine.test_generator import prompt_ids
from tests.engine.test_server import post
from tests.server_support import ServerThread, metric
from tests.engine.test_server_batching import scrape, wait_for

pytestmark = pytest.mark.timeout(300)
PS = 16
N_NEW = 60


def stream(client, model, prompt, priority=None):
    """A greedy streamed completion of exactly N_NEW tokens: its text."""
    extra = {} if priority is None else {"priority": priority}
    out = client.completions.create(model=model, prompt=prompt, max_tokens=N_NEW, temperature=0, stream=True,
                                    extra_body={"ignore_eos": True, **extra})
    return "".join(c.choices[0].text for c in out if c.choices)


def test_the_worse_priority_stream_is_preempted_and_both_equal_their_solo_runs(tiny_llama_folder):
    older, newer = (prompt_ids(20, seed)[0].tolist() for seed in (1, 2))
    # 6 pages of 16: one request (20 + 60 tokens, 5 pages) fits alone; two at once must preempt one.
    with ServerThread(tiny_llama_folder, cache_tokens=6 * PS, page_size=PS, max_chunk_size=PS) as server:
        client, model = server.client(), server.model_name
        alone = [stream(client, model, p) for p in (older, newer)]
        assert metric(scrape(server), "vllm:num_preemptions_total") == 0
        finished, lock = [], threading.Lock()

        def run(name, prompt, priority):
            text = stream(client, model, prompt, priority)
            with lock:
                finished.append(name)
            return text

        with ThreadPoolExecutor(2) as pool:
            with server.hold_generator():
                # The older request ranks worse: without its priority the newer one (the tie-break's victim)
                # would be preempted instead.
                a = pool.submit(run, "older", older, 1)
                wait_for(lambda: server.server.requests_running == 1, "the first request in the server")
                server.call(asyncio.sleep(0))  # its handler has queued its job
                b = pool.submit(run, "newer", newer, 0)
                wait_for(lambda: server.server.requests_running == 2, "both requests in the server")
                server.call(asyncio.sleep(0))
            texts = [a.result(), b.result()]
        assert metric(scrape(server), "vllm:num_preemptions_total") > 0
        assert finished == ["newer", "older"]  # the preempted one waited for the pages
        assert texts == alone


def test_priority_is_an_integer(tiny_llama_folder):
    with ServerThread(tiny_llama_folder, cache_tokens=8 * PS, page_size=PS) as server:
        for path, body in [("/v1/completions", {"prompt": "Hi"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})]:
            for bad in ["high", 1.5, True, [0]]:
                status, reply = post(server.url + path, {**body, "priority": bad, "max_tokens": 2})
                assert status == 400, (path, bad, reply)
                err = reply["error"]
                assert err["param"] == "priority" and err["type"] == "invalid_request_error", err
                assert "priority" in err["message"]
            for good in [-3, 0, 7, None]:
                status, reply = post(server.url + path, {**body, "priority": good, "max_tokens": 2})
                assert status == 200, (path, good, reply)

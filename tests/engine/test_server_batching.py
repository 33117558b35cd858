"""The server under load: concurrent streams batch, a disconnect frees its pages, adapters are never mixed up.

Arrival is pinned by holding the generator's worker between steps while the requests come in (so the
test never depends on how fast a thread starts); everything else is the real scheduler. Outputs are
checked against each request run alone (dense fp32: batching must not change a greedy token).
"""
from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.server_support import ServerThread, metric, metric_samples
from tests.engine.test_server import post, solo

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder):
    from engine import Model, Tokenizer

    return Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)


def scrape(server: ServerThread) -> str:
    with urllib.request.urlopen(server.url + "/metrics", timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        return r.read().decode()


def wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_sixteen_concurrent_streams_batch_and_match_solo_runs(tiny_llama_folder, tiny):
    chats = [[{"role": "user", "content": f"Tell me about number {i}."}] for i in range(16)]
    with ServerThread(tiny_llama_folder, cache_tokens=16 * 96, page_size=16) as server:
        client = server.client()
        pages_seen = {}

        def stream(messages):
            out = client.chat.completions.create(model=server.model_name, messages=messages, max_tokens=48,
                                                 temperature=0, stream=True, stream_options={"include_usage": True})
            chunks = list(out)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage

        with ThreadPoolExecutor(16) as pool:
            with server.hold_generator():
                futures = [pool.submit(stream, m) for m in chats]
                wait_for(lambda: server.server.requests_running == 16, "16 requests in the server")
            wait_for(lambda: server.snapshot()["active_jobs"] >= 8 or all(f.done() for f in futures), "a batch")
            with server.hold_generator():  # the jobs stay on the page map while we look
                with urllib.request.urlopen(server.url + "/pagedeck/pages") as r:
                    pages_seen = json.loads(r.read())
            results = [f.result() for f in futures]
        text = scrape(server)
        assert metric(text, "pagedeck:batch_size_peak") >= 8
        assert metric(text, "vllm:generation_tokens_total") == sum(u.completion_tokens for _, u in results)
        assert metric(text, "vllm:time_to_first_token_seconds_count") == 16
        assert metric(text, "pagedeck:api_requests_total") == 16 and metric(text, "pagedeck:api_requests_running") == 0
        assert metric(text, "vllm:num_requests_running") == 0 and metric(text, "vllm:kv_cache_usage_perc") == 0
        owners = set(pages_seen["page_owner_identifiers"].values())
        assert owners and all(o.startswith("chatcmpl-") for o in owners)  # API jobs on the page map by request id
        assert len(pages_seen["page_states"]) == pages_seen["pages_total"] == 96
    for messages, (got, usage) in zip(chats, results):
        want, tokens = solo(tiny, messages, 48)
        assert got == want and usage.completion_tokens == len(tokens)


def test_client_disconnect_cancels_the_job_and_frees_its_pages(tiny_llama_folder):
    with ServerThread(tiny_llama_folder) as server:
        before = metric(scrape(server), "vllm:generation_tokens_total")
        conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=60)
        body = {"model": server.model_name, "messages": [{"role": "user", "content": "Go on forever."}],
                "max_tokens": 450, "stream": True, "ignore_eos": True}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        content_chunks = 0
        while content_chunks < 3:
            line = resp.readline().decode()
            assert line, "the stream ended early"
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                content_chunks += 1
        assert server.snapshot()["pages_referenced"] > 0
        conn.sock.close()  # the client goes away mid-stream
        conn.close()
        wait_for(lambda: server.server.requests_running == 0, "the server to drop the request")
        m = server.snapshot()
        assert m["active_jobs"] == m["pending_jobs"] == m["pages_referenced"] == 0
        assert m["pages_free"] + m["pages_cached"] == m["pages_total"]
        assert metric(scrape(server), "vllm:generation_tokens_total") - before < 450  # stopped, not finished
        ok = server.client().chat.completions.create(model=server.model_name, messages=body["messages"], max_tokens=3)
        assert ok.usage.completion_tokens == 3


def test_a_request_cancelled_again_while_it_releases_its_job_still_frees_it(tiny_llama_folder):
    """A lost connection may cancel a handler that is already releasing its job (a write met the reset first):
    the second cancellation must not leave the request counted, or its pages held."""
    def awaiting(coro):  # the coroutine names down a task's await chain
        while hasattr(coro, "cr_code"):
            yield coro.cr_code.co_name
            coro = coro.cr_await

    def handler_tasks():
        return [t for t in asyncio.all_tasks() if "_generate" in awaiting(t.get_coro())]

    async def cancel_handler():
        (task,) = handler_tasks()
        task.cancel()
        for _ in range(100):  # on to the release, which waits for the held generator
            await asyncio.sleep(0)
        assert task in handler_tasks() or not task.done(), "the handler should still be releasing its job"
        task.cancel()

    with ServerThread(tiny_llama_folder) as server:
        conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=60)
        body = {"model": server.model_name, "messages": [{"role": "user", "content": "Go on forever."}],
                "max_tokens": 450, "stream": True, "ignore_eos": True}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
        with server.hold_generator():
            server.call(cancel_handler())
            assert server.server.requests_running == 1  # the job's cancel waits for the worker
        conn.close()
        wait_for(lambda: server.server.requests_running == 0, "the server to count the request out")
        m = server.snapshot()
        assert m["active_jobs"] == m["pending_jobs"] == m["pages_referenced"] == 0


def test_non_streamed_request_cancelled_by_a_client_timeout_frees_its_job(tiny_llama_folder):
    with ServerThread(tiny_llama_folder) as server:
        slow = server.client(timeout=0.5)
        with server.hold_generator():  # the reply can't finish before the client gives up
            with pytest.raises(openai.APITimeoutError):
                slow.chat.completions.create(model=server.model_name, max_tokens=400, extra_body={"ignore_eos": True},
                                             messages=[{"role": "user", "content": "Take your time."}])
        wait_for(lambda: server.server.requests_running == 0, "the server to drop the request")
        m = server.snapshot()
        assert m["active_jobs"] == m["pages_referenced"] == 0


@pytest.fixture(scope="module")
def adapters(tiny_llama_folder, tmp_path_factory):
    from tests.engine.test_lora import write_peft_adapter

    root = tmp_path_factory.mktemp("server-adapters")
    return {"ada": write_peft_adapter(tiny_llama_folder, root / "ada", seed=5),
            "bob": write_peft_adapter(tiny_llama_folder, root / "bob", seed=6, targets=["q_proj", "v_proj"])}


def test_adapters_are_models_batched_together_and_never_mixed_up(tiny_llama_folder, tiny, adapters):
    """Each request's `model` picks its adapter; requests for the base model and two adapters run in the
    same steps (per-job LoRA: no swap, no waiting) and each equals its request run alone."""
    q = [{"role": "user", "content": "Which adapter am I talking to?"}]
    want = {name: solo(tiny, q, 12, loras=path)[0] for name, path in adapters.items()}
    with ServerThread(tiny_llama_folder, adapters={"ada": adapters["ada"]}) as server:
        want[server.model_name] = solo(tiny, q, 12)[0]
        assert len(set(want.values())) == 3  # the adapters really change the output
        models = {m.id: m for m in server.client().models.list().data}
        assert set(models) == {server.model_name, "ada"} and models["ada"].parent == server.model_name
        status, text = post(server.url + "/v1/load_lora_adapter", {"lora_name": "bob", "lora_path": str(adapters["bob"])})
        assert status == 200 and "bob" in text
        assert {m.id for m in server.client().models.list().data} == {server.model_name, "ada", "bob"}
        assert set(server.generator.adapters().folders) == {"ada", "bob"}  # one registry: the generator's
        client = server.client()
        order = [server.model_name, "ada", "bob", server.model_name, "bob", "ada", "ada", server.model_name]

        def ask(name):
            r = client.chat.completions.create(model=name, messages=q, max_tokens=12, temperature=0)
            return r.choices[0].message.content

        with ThreadPoolExecutor(len(order)) as pool:
            with server.hold_generator():  # every request is queued before the first step
                futures = [pool.submit(ask, name) for name in order]
                wait_for(lambda: server.server.requests_running == len(order), "all requests in the server")
            got = [f.result() for f in futures]
        assert got == [want[name] for name in order]
        m = server.snapshot()
        assert m["batch_size_peak"] == len(order) and m["deferred_jobs"] == 0  # one batch, three adapter sets
        assert sorted(map(tuple, m["adapter_sets"].values())) == [(), (("ada", 1.0),), (("bob", 1.0),)]
        assert post(server.url + "/v1/unload_lora_adapter", {"lora_name": "bob"})[0] == 200
        with pytest.raises(openai.NotFoundError, match="`bob` does not exist"):
            ask("bob")
        assert "bob" not in server.generator.adapters().folders
        assert post(server.url + "/v1/unload_lora_adapter", {"lora_name": "bob"})[0] == 404
        status, body = post(server.url + "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/no/such/dir"})
        assert status == 404 and "does not exist" in body["error"]["message"]
        status, body = post(server.url + "/v1/load_lora_adapter", {"lora_name": "ada", "lora_path": str(adapters["ada"])})
        assert status == 400 and "already been loaded" in body["error"]["message"]
        broken = adapters["ada"].parent / "broken"
        broken.mkdir(exist_ok=True)
        (broken / "adapter_config.json").write_text("{}")
        assert post(server.url + "/v1/load_lora_adapter", {"lora_name": "br", "lora_path": str(broken)})[0] == 400
        assert ask(server.model_name) == want[server.model_name]
        samples = metric_samples(scrape(server))
        assert samples[("vllm:num_requests_waiting", ())] == 0


def test_unloading_an_adapter_lets_its_running_request_finish(tiny_llama_folder, tiny, adapters):
    """vLLM's rule: an unload refuses new requests at once; one already running keeps its adapter."""
    q = [{"role": "user", "content": "Which adapter am I talking to?"}]
    want = solo(tiny, q, 12, loras=adapters["ada"])[0]
    with ServerThread(tiny_llama_folder, adapters={"ada": adapters["ada"]}) as server:
        client = server.client()
        with ThreadPoolExecutor(2) as pool:
            with server.hold_generator():  # the job's enqueue and the unload run in one batch of commands
                running = pool.submit(lambda: client.chat.completions.create(
                    model="ada", messages=q, max_tokens=12, temperature=0).choices[0].message.content)
                wait_for(lambda: server.server.requests_running == 1, "the request in the server")
                unloaded = pool.submit(post, server.url + "/v1/unload_lora_adapter", {"lora_name": "ada"})
                wait_for(lambda: len(server.generator._commands) == 2, "the unload queued behind the job")
            assert unloaded.result()[0] == 200
            assert {m.id for m in client.models.list().data} == {server.model_name}
            assert running.result() == want  # ran with its adapter to the end
        with pytest.raises(openai.NotFoundError, match="`ada` does not exist"):
            client.chat.completions.create(model="ada", messages=q, max_tokens=4)
        wait_for(lambda: not server.generator.adapters().folders, "the adapter to be dropped")


def test_an_adapter_unloaded_between_a_requests_check_and_its_queueing_is_a_404(tiny_llama_folder, adapters):
    """A request checks its adapter when its job is made; an unload queued before the job reaches the
    generator wins, and the request hears the unknown-model 404 an earlier unload gives, not a 500."""
    q = [{"role": "user", "content": "Which adapter am I talking to?"}]
    with ServerThread(tiny_llama_folder, adapters={"ada": adapters["ada"]}) as server:
        client = server.client()
        with ThreadPoolExecutor(2) as pool:
            with server.hold_generator():  # the unload runs first, then the already-checked job's enqueue
                unloaded = pool.submit(post, server.url + "/v1/unload_lora_adapter", {"lora_name": "ada"})
                wait_for(lambda: len(server.generator._commands) == 1, "the unload queued")
                asked = pool.submit(lambda: client.chat.completions.create(
                    model="ada", messages=q, max_tokens=4, temperature=0))
                wait_for(lambda: len(server.generator._commands) == 2, "the job queued behind the unload")
            assert unloaded.result()[0] == 200
            with pytest.raises(openai.NotFoundError, match="`ada` does not exist"):
                asked.result()
        assert client.chat.completions.create(model=server.model_name, messages=q, max_tokens=2).choices
        wait_for(lambda: server.snapshot()["pages_referenced"] == 0, "the pages back")

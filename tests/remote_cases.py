"""Client tests of the app's remote backend, shared by two servers (holds no `remote` fixture itself).

tests/app/test_remote_pagedeck.py runs them against pagedeck's own server in the main suite;
tests/integration/test_remote_vllm.py runs the very same functions against a real vLLM (`make test-vllm`).
Each gets a `remote` fixture with `url` and `key`. The checks go through the app's own code: RemoteBackend
streams the chats into ReplyTracker (what a chat pane shows) and remote_metrics parses /metrics (what the
dashboard draws).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from app.chat.chat_session import ReplyTracker
from app.core.remote_backend import RemoteBackend
from app.core.remote_client import RemoteClient, RemoteError
from app.core.remote_metrics import snapshot_from_metrics
from app.core.store import ChatSettings

PIRATE = Path(__file__).resolve().parent.parent / "resources" / "loras" / "pirate"
PIRATE_WORDS = ("arr", "matey", "ahoy", "me hearty", " ye ", "th' ")
GREEDY = ChatSettings(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0, max_new_tokens=48)
TIMEOUT = 600


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


async def chat(backend: RemoteBackend, identifier, text: str, settings: ChatSettings,
               tracker: ReplyTracker | None = None) -> ReplyTracker:
    """One reply, folded exactly as a chat pane folds it; errors end up in tracker.stats.error."""
    tracker = ReplyTracker(time.perf_counter()) if tracker is None else tracker
    try:
        job, tracker.stats.prompt_tokens = backend.start_job(identifier, [{"role": "user", "content": text}], settings)
        async for r in job:
            tracker.feed(r, time.perf_counter())
    except RemoteError as exc:
        tracker.fail(exc)
    finally:
        backend.job_ended(identifier)
    return tracker


def test_remote_chat_answers_paris(remote):
    async def body():
        backend = RemoteBackend(remote.url, remote.key)
        info = await backend.connect()
        try:
            reply = await chat(backend, "paris", "What is the capital of France?", GREEDY)
        finally:
            await backend.close()
        s = reply.stats
        assert "Paris" in reply.text, reply.text
        assert s.state == "done" and s.eos_reason in ("stop", "length") and s.error is None
        assert s.prompt_tokens > 5 and 0 < s.new_tokens <= 48 and s.ttft_s > 0 and s.tokens_per_s > 0
        assert info["model"] == backend.model

    run(body())


def test_four_chats_at_once_show_in_the_parsed_metrics(remote):
    """Four chats streaming at once read as four running requests in /metrics, parsed as the dashboard does.

    The evidence is a scrape sent after every chat had its first token and answered before any chat ended:
    the server runs all four then, and such scrapes must reach 4. A round in which no scrape fits that stretch
    (the client or the server's metrics held up for the whole generation) shows nothing either way; it runs
    again, three rounds at most, and the failure lists every round's scrapes."""
    topics = ("a dragon", "a lighthouse keeper", "a lost robot", "a pirate ship")
    long = ChatSettings(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0, max_new_tokens=160)

    async def one_round(backend: RemoteBackend, monitor: RemoteClient) -> tuple[list, list, float]:
        t0 = time.perf_counter()
        trackers = [ReplyTracker(t0) for _ in topics]
        chats = [asyncio.ensure_future(chat(backend, i, f"Write a long story about {t}.", long, trackers[i]))
                 for i, t in enumerate(topics)]

        def all_streaming() -> bool:  # every chat has a token and none has ended
            return all(t.stats.ttft_s is not None and t.stats.state == "streaming" for t in trackers)

        scrapes, kv_peak = [], 0.0  # scrapes: (sent s, answered s, running, inside the all-streaming stretch)
        while not all(c.done() for c in chats):
            before, sent = all_streaming(), time.perf_counter() - t0
            snap = snapshot_from_metrics(await monitor.metrics_text())
            scrapes.append((round(sent, 2), round(time.perf_counter() - t0, 2), snap["active_jobs"],
                            before and all_streaming()))
            kv_peak = max(kv_peak, snap["kv_usage"])
            await asyncio.sleep(0.1)
        return [c.result() for c in chats], scrapes, kv_peak

    async def body():
        backend = RemoteBackend(remote.url, remote.key)
        await backend.connect()
        monitor = RemoteClient(remote.url, remote.key)
        rounds = []
        try:
            for _ in range(3):
                replies, scrapes, kv_peak = await one_round(backend, monitor)
                assert all(r.stats.state == "done" and r.stats.new_tokens > 0 for r in replies), \
                    [r.stats for r in replies]
                rounds.append(scrapes)
                inside = [running for *_, running, within in scrapes if within]
                if inside:
                    break
            else:
                raise AssertionError(f"no scrape fell while all four chats were streaming, in 3 rounds: {rounds}")
        finally:
            await monitor.close()
            await backend.close()
        assert max(inside) == 4, f"the server never reported all four chats running at once: {rounds}"
        assert kv_peak > 0, "no KV-cache usage seen while generating"
        client = RemoteClient(remote.url, remote.key)
        try:
            after = snapshot_from_metrics(await client.metrics_text())
        finally:
            await client.close()
        assert after["active_jobs"] == 0 and after["tokens_generated_total"] >= sum(r.stats.new_tokens for r in replies)

    run(body())


def test_runtime_lora_load_pirate_reply_unload_and_404(remote):
    question = "What should I cook for dinner tonight?"

    async def body():
        backend = RemoteBackend(remote.url, remote.key)
        await backend.connect()
        try:
            await backend.client.load_adapter("pirate", str(PIRATE))
            await backend.refresh()
            assert [(a["id"], a["parent"]) for a in backend.adapters] == [("pirate", backend.base_model)]
            backend.model = "pirate"
            pirate = await chat(backend, "p", question, GREEDY)
            backend.model = backend.base_model
            base = await chat(backend, "b", question, GREEDY)
            own = await chat(backend, "o", question, replace(GREEDY, loras=(("pirate", 1.0),)))  # the chat's own
            two = await chat(backend, "t", question, replace(GREEDY, loras=(("pirate", 1.0), ("x", 1.0))))
            await backend.client.unload_adapter("pirate")
            await backend.refresh()
            assert backend.adapters == []
            backend.model = "pirate"  # a chat still naming the unloaded adapter
            gone = await chat(backend, "g", question, GREEDY)
            try:
                await backend.client.unload_adapter("pirate")
                unload_error = None
            except RemoteError as exc:
                unload_error = exc
        finally:
            await backend.close()
        assert any(w in pirate.text.lower() for w in PIRATE_WORDS), pirate.text
        assert not any(w in base.text.lower() for w in PIRATE_WORDS), base.text
        assert own.text == pirate.text and own.stats.adapter_pairs() == pirate.stats.adapter_pairs() == [("pirate", 1.0)]
        assert base.stats.adapter_pairs() == []
        assert two.stats.state == "error" and "one adapter per request" in two.stats.error
        assert gone.stats.state == "error" and "HTTP 404" in gone.stats.error and "pirate" in gone.stats.error
        assert unload_error is not None and unload_error.status == 404

    run(body())

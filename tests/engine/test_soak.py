"""The soak bench, short: 16 clients for 20 s against a real `python -m engine serve` on a tiny random model,
with an adapter loaded and unloaded during the run. Everything the bench does not ask for must be absent (no
5xx, no broken stream, no error outside OpenAI's shape), every page back at the end, the server healthy.
The 10-minute, 64-client run on the default model is `make soak` (figures in docs/server/soak.md).

And what a long run's memory depends on, in process: the same requests repeated leave no Python objects or
tensors behind, a model's tokenizer is not kept by the sampler's caches once the model is gone, and heap
memory freed during steps goes back to the OS when the queue drains (glibc keeps it otherwise: that, not
live objects, was the default model's RSS growth per 1000 requests)."""
from __future__ import annotations

import asyncio
import collections
import gc
import json
import random
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from engine import DynamicGenerator, Model, PagedCache, SamplerSettings, Tokenizer
from engine.bench import soak
from engine.generator.heap_trim import HeapTrim
from tests.engine.test_lora import write_peft_adapter
from tests.server_support import ServerThread

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(400)


def test_sixteen_clients_for_twenty_seconds_leave_no_unasked_error_and_no_page(tiny_llama_folder, tmp_path):
    adapter = write_peft_adapter(tiny_llama_folder, tmp_path / "adapter")
    out = subprocess.run([sys.executable, "-m", "engine", "soak", "--model", str(tiny_llama_folder),
                          "--clients", "16", "--duration", "20", "--every", "5", "--threads", "1",
                          "--cache-tokens", "4096", "--adapter", str(adapter), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=360)
    lines = out.stdout.strip().splitlines()
    assert len(lines) >= 2, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(lines[-2])
    assert out.returncode == 0 and lines[-1] == "soak: OK", json.dumps(report, indent=1)[-4000:]
    assert report["unexpected_errors"] == 0 and report["served"] > 20
    assert report["pages_referenced_at_end"] == 0 and report["healthy_at_end"]
    asked = report["asked_errors"]
    assert asked.get("400 bad request", 0) > 0 and asked.get("dropped mid-stream", 0) > 0
    assert asked.get("cancelled", 0) > 0 and report["adapter_cycles"] >= 1
    assert report["ttft_p50_ms"] is not None and len(report["rss_mb"]) >= 4


def _self_rss() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_a_dropped_generator_lets_its_model_cache_and_tokenizer_go_at_once(tiny_llama_folder):
    """DRY's sequence breakers are strings mapped to token ids once per tokenizer; that cache held the
    tokenizer itself (an lru_cache of 16), so each model reload in the app left one more tokenizer behind.
    And the page table held the generator (a bound method), a cycle that kept the model and the cache until
    a full garbage collection: with the collector off, everything must go with the last reference."""
    model, tokenizer = Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=256, page_size=16), tokenizer)
    dry = SamplerSettings(dry_multiplier=0.8, xtc_probability=0.5, xtc_threshold=0.1)
    assert gen.generate("a b a b a b", max_new_tokens=4, gen_settings=dry, seed=1, completion_only=True) is not None
    refs = {type(o).__name__: weakref.ref(o) for o in (gen, model, gen.cache, tokenizer)}
    gc.disable()
    try:
        del gen, model, tokenizer
        alive = [name for name, ref in refs.items() if ref() is not None]
    finally:
        gc.enable()
    assert not alive, f"still alive without a collection: {alive}"


def test_heap_freed_during_steps_goes_back_to_the_os_when_the_queue_drains(tiny_llama_folder):
    """Chunks below glibc's mmap threshold come from the heap and stay there when freed; with a few kept
    alive among them (as a busy step's long-lived objects are) the heap's top can't shrink either. The
    generator's trim when its queue drains gives those pages back."""
    model, tokenizer = Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=256, page_size=16), tokenizer)
    gen.heap = HeapTrim(idle_period=0.0)
    gen.generate("warm up", max_new_tokens=2)
    before = _self_rss()
    chunks = [b"x" * 60_000 for _ in range(3000)]  # ~180 MB in 60 kB heap chunks
    kept = chunks[::100]
    del chunks
    held = _self_rss()
    assert held - before > 120, (before, held)  # glibc kept the freed chunks (else this test shows nothing)
    gen.generate("the queue drains after this", max_new_tokens=2)
    after = _self_rss()
    assert after - before < 40, f"RSS {before:.0f} MB -> {held:.0f} MB with the chunks freed -> {after:.0f} MB idle"
    assert len(kept) == 30


def test_repeated_requests_leave_no_objects_or_tensors_behind(tiny_llama_folder):
    """The soak's request mix (streamed, whole, raw completions, dropped streams, cancels, bad requests) in
    process on a real server: after a warm-up round, more rounds grow no Python type and no tensor count
    (a per-request structure kept anywhere, e.g. a job map, a cache keyed by request, would show here)."""
    def census() -> tuple[collections.Counter, int]:
        gc.collect()
        objs = gc.get_objects()
        return (collections.Counter(type(o).__name__ for o in objs),
                sum(1 for o in objs if isinstance(o, torch.Tensor)))

    async def requests(url: str, n: int, seed: int) -> soak.Tally:
        import aiohttp

        tally, rng = soak.Tally(), random.Random(seed)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            async with http.get(url + "/v1/models") as resp:
                model = (await resp.json())["data"][0]
            clients = soak.Clients(url, model, tally, rng, adapter=False)

            async def client():
                while tally.requests < n:
                    await clients.one(http)

            await asyncio.gather(*(client() for _ in range(8)))
        return tally

    with ServerThread(tiny_llama_folder, cache_tokens=2048) as server:
        rounds = []
        for seed in range(4):
            tally = asyncio.run(requests(server.url, 120, seed))
            assert not tally.unexpected and tally.served > 20, tally.unexpected[:5]
            server.call(asyncio.sleep(0.5))  # the last cancels reach the generator
            rounds.append(census())
    (types, tensors), (types_end, tensors_end) = rounds[1], rounds[-1]
    grown = {name: types_end[name] - types[name] for name in types_end if types_end[name] - types[name] > 30}
    assert not grown, f"object counts grew over 240 requests: {grown}"
    assert tensors_end <= tensors + 5, (tensors, tensors_end)

"""DynamicGeneratorAsync / DynamicJobAsync on a tiny random model: concurrency, cancel, failures, LoRA deferral.

Timing-sensitive moments are pinned with a gate inside model.forward (the worker blocks there until the
test opens it), so every assertion is about order, never about how long something took.
"""
from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from engine.generator.async_api import DynamicGeneratorAsync, DynamicJobAsync

GREEDY = SamplerSettings.greedy()
TIMEOUT = 60  # seconds: a hang becomes a failure, not a stuck suite


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder):
    return Model.load(tiny_llama_folder), Tokenizer.load(tiny_llama_folder)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


def make_async(tiny, **kw) -> DynamicGeneratorAsync:
    model, tok = tiny
    return DynamicGeneratorAsync(model=model, cache=PagedCache(model, max_tokens=1024, page_size=16),
                                 tokenizer=tok, **kw)


def prompt(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(10, 40000, (1, n), generator=torch.Generator().manual_seed(seed))


def sync_greedy(tiny, ids: torch.Tensor, n: int, loras=None) -> list[int]:
    """The same job on the sync generator: the reference for what the async path must stream."""
    model, tok = tiny
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), tok)
    gen.set_loras(loras)
    job = DynamicJob(ids, n, gen_settings=GREEDY)
    gen.enqueue(job)
    out = []
    while gen.num_remaining_jobs():
        out += [t for r in gen.iterate() if r["stage"] == "streaming" for t in r["token_ids"]]
    return out


def write_adapter(folder, seed: int = 0):
    """A PEFT LoRA adapter for the tiny model, strong enough to change its greedy output."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    rank, shapes = 4, {"q_proj": (64, 64), "v_proj": (64, 32), "o_proj": (64, 64)}  # (in, out)
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 8, "bias": "none", "target_modules": list(shapes)}))
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(2):
        for module, (n_in, n_out) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, n_in, generator=g)
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, rank, generator=g)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


async def collect(job: DynamicJobAsync, log: list | None = None, name=None) -> list[dict]:
    results = []
    async for r in job:
        results.append(r)
        if log is not None:
            log.append((name, r["stage"], r.get("eos", False)))
    return results


def tokens_of(results: list[dict]) -> list[int]:
    return [t for r in results if r["stage"] == "streaming" for t in r.get("token_ids", [])]


class Gate:
    """Blocks the worker inside model.forward when closed; tells the test when it is parked there."""

    def __init__(self, monkeypatch, model):
        self.open_ = threading.Event()
        self.open_.set()
        self.parked = threading.Event()
        self.fail_with: BaseException | None = None
        inner = model.forward

        def forward(batch, cache, lora=None, rotary=None):
            if self.fail_with is not None:
                exc, self.fail_with = self.fail_with, None
                raise exc
            if not self.open_.is_set():
                self.parked.set()
                self.open_.wait(TIMEOUT)
            return inner(batch, cache, lora, rotary)

        monkeypatch.setattr(model, "forward", forward)

    def close(self):
        self.parked.clear()
        self.open_.clear()

    def open(self):
        self.open_.set()

    async def wait_parked(self):
        assert await asyncio.to_thread(self.parked.wait, TIMEOUT), "the worker never reached model.forward"


def test_jobs_stream_concurrently_and_results_reach_the_right_job(tiny):
    prompts = [prompt(9 + 7 * i, seed=i) for i in range(3)]
    expected = [sync_greedy(tiny, p, 12) for p in prompts]

    async def main():
        agen = make_async(tiny)
        try:
            log: list = []
            jobs = [DynamicJobAsync(agen, input_ids=p, max_new_tokens=12, gen_settings=GREEDY, identifier=i)
                    for i, p in enumerate(prompts)]
            results = await asyncio.gather(*(collect(j, log, i) for i, j in enumerate(jobs)))
            return log, results
        finally:
            await agen.close()

    log, results = run(main())
    first_eos = next(k for k, (_, _, eos) in enumerate(log) if eos)
    streamed_before = {name for name, stage, _ in log[:first_eos] if stage == "streaming"}
    assert streamed_before == {0, 1, 2}  # every job had partial text before any finished
    for i, res in enumerate(results):
        assert [r["identifier"] for r in res] == [i] * len(res)
        assert res[-1]["eos"] and res[-1]["eos_reason"] == "max_new_tokens"
        assert tokens_of(res) == expected[i]  # no token was routed to the wrong job


def test_iterate_runs_on_one_worker_thread_and_the_loop_stays_free(tiny, monkeypatch):
    model, _ = tiny
    gate = Gate(monkeypatch, model)

    async def main():
        agen = make_async(tiny)
        threads = set()
        inner = agen._generator.iterate

        def iterate():
            threads.add(threading.get_ident())
            return inner()

        agen._generator.iterate = iterate
        try:
            gate.close()
            job = DynamicJobAsync(agen, input_ids=prompt(8), max_new_tokens=4, gen_settings=GREEDY)
            # The worker is now parked inside a forward pass: were it on the loop thread, this
            # coroutine could not run at all (and the gate would never open).
            await gate.wait_parked()
            ticks = 0
            for _ in range(3):
                await asyncio.sleep(0)
                ticks += 1
            gate.open()
            results = await collect(job)
            return threads, agen._worker.ident, threading.get_ident(), ticks, results
        finally:
            gate.open()
            await agen.close()

    threads, worker, loop_thread, ticks, results = run(main())
    assert threads == {worker} and worker != loop_thread
    assert ticks == 3 and results[-1]["eos"]


def test_cancel_wakes_the_consumer_and_frees_the_pages(tiny, monkeypatch):
    model, _ = tiny
    gate = Gate(monkeypatch, model)
    other_prompt = prompt(11, seed=5)
    expected_other = sync_greedy(tiny, other_prompt, 20)

    async def main():
        agen = make_async(tiny)
        try:
            victim = DynamicJobAsync(agen, input_ids=prompt(20, seed=4), max_new_tokens=400, gen_settings=GREEDY)
            other = DynamicJobAsync(agen, input_ids=other_prompt, max_new_tokens=20, gen_settings=GREEDY)
            seen = {victim: [], other: []}
            for job in (victim, other):
                while not seen[job] or seen[job][-1]["stage"] != "streaming":
                    seen[job].append(await job.__anext__())
            held = agen.metrics()["page_states"].count(victim.serial)
            gate.close()
            await gate.wait_parked()  # the worker is mid-step and cannot deliver anything now
            consumer = asyncio.create_task(collect(victim))
            await asyncio.sleep(0)  # the consumer is now waiting in __anext__
            canceller = asyncio.create_task(victim.cancel())
            rest = await asyncio.wait_for(consumer, 5)  # woken while the worker is still parked
            assert not canceller.done()  # cancel() returns only once the generator dropped the job
            gate.open()
            await canceller
            after_cancel = agen.metrics()
            after_cancel["victim_pages"] = after_cancel["page_states"].count(victim.serial)
            after_cancel["other_pages"] = after_cancel["page_states"].count(other.serial)
            other_results = seen[other] + await collect(other)
            final = agen.metrics()
            return held, rest, after_cancel, other_results, final
        finally:
            gate.open()
            await agen.close()

    held, rest, after_cancel, other_results, final = run(main())
    assert rest[-1]["eos"] and rest[-1]["eos_reason"] == "cancelled"
    # The victim held pages for what it had written (its 20-token prompt and first tokens: 2 pages of 16, a few
    # more if the worker ran on meanwhile; never its 420-token budget's 27), and cancel() released them.
    assert 2 <= held < 27 and after_cancel["victim_pages"] == 0
    assert after_cancel["pages_referenced"] == after_cancel["other_pages"] and after_cancel["active_jobs"] <= 1
    assert tokens_of(other_results) == expected_other  # the job beside it was not disturbed
    assert final["pages_referenced"] == 0 and final["active_jobs"] == 0 and final["pending_jobs"] == 0


def test_engine_failure_reaches_every_waiting_job_and_the_worker_recovers(tiny, monkeypatch):
    model, _ = tiny
    gate = Gate(monkeypatch, model)
    later_prompt = prompt(10, seed=9)
    expected_later = sync_greedy(tiny, later_prompt, 8)

    async def main():
        agen = make_async(tiny)
        try:
            jobs = [DynamicJobAsync(agen, input_ids=prompt(12, seed=i), max_new_tokens=300, gen_settings=GREEDY)
                    for i in range(3)]
            for job in jobs:
                while (await job.__anext__())["stage"] != "streaming":
                    pass
            gate.fail_with = RuntimeError("injected forward failure")
            outcomes = []
            for job in jobs:
                try:
                    await collect(job)
                    outcomes.append(None)
                except RuntimeError as exc:
                    outcomes.append(str(exc))
            after = agen.metrics()
            later = await collect(DynamicJobAsync(agen, input_ids=later_prompt, max_new_tokens=8,
                                                  gen_settings=GREEDY))
            return outcomes, after, later, agen._worker.is_alive()
        finally:
            await agen.close()

    outcomes, after, later, alive = run(main())
    assert outcomes == ["injected forward failure"] * 3
    assert after["active_jobs"] == 0 and after["pages_referenced"] == 0  # failed jobs dropped, pages back
    assert alive and tokens_of(later) == expected_later


def test_a_bad_job_fails_alone(tiny):
    good_prompt = prompt(9, seed=2)
    expected = sync_greedy(tiny, good_prompt, 10)

    async def main():
        agen = make_async(tiny)
        try:
            with pytest.raises(ValueError, match="max_new_tokens"):
                DynamicJobAsync(agen, input_ids=good_prompt, max_new_tokens=0)  # refused by DynamicJob at once
            good = DynamicJobAsync(agen, input_ids=good_prompt, max_new_tokens=10, gen_settings=GREEDY)
            with pytest.raises(ValueError, match="exceeds max_seq_len"):  # refused before it is queued
                DynamicJobAsync(agen, input_ids=prompt(1000, seed=3), max_new_tokens=100)
            return await collect(good)
        finally:
            await agen.close()

    assert tokens_of(run(main())) == expected


def test_set_loras_while_busy_defers_new_jobs_until_the_running_ones_finish(tiny):
    prompts = [prompt(7, seed=20 + i) for i in range(2)]
    expected = [sync_greedy(tiny, p, 5) for p in prompts]

    async def main():
        agen = make_async(tiny)
        worker_log: list = []  # written on the worker thread only, so its order is the true order
        inner_swap, inner_iterate = agen._generator.set_loras, agen._generator.iterate

        def set_loras(loras, scales=None):
            worker_log.append(("swap", agen._generator.num_remaining_jobs()))
            inner_swap(loras, scales)

        def iterate():
            results = inner_iterate()
            worker_log.extend((r["identifier"], r["stage"], r.get("eos", False)) for r in results)
            return results

        agen._generator.set_loras, agen._generator.iterate = set_loras, iterate
        try:
            running = DynamicJobAsync(agen, input_ids=prompt(6, seed=1), max_new_tokens=25, gen_settings=GREEDY,
                                      identifier="running")
            while (await running.__anext__())["stage"] != "streaming":
                pass
            swap = asyncio.create_task(agen.set_loras(None))
            await asyncio.sleep(0)
            pending = agen.pending_loras
            deferred = [DynamicJobAsync(agen, input_ids=p, max_new_tokens=5, gen_settings=GREEDY, identifier=f"d{i}")
                        for i, p in enumerate(prompts)]
            firsts = [await d.__anext__() for d in deferred]
            counts = (agen.num_deferred, agen.metrics()["deferred_jobs"])
            rest = await collect(running)
            await swap
            outs = await asyncio.gather(*(collect(d) for d in deferred))
            return pending, firsts, counts, rest, outs, worker_log, agen.pending_loras, agen.num_deferred, deferred
        finally:
            await agen.close()

    pending, firsts, counts, rest, outs, log, pending_after, n_after, deferred = run(main())
    assert pending == (None, None)
    assert [f["stage"] for f in firsts] == ["deferred", "deferred"] and counts == (2, 2)
    assert rest[-1]["eos_reason"] == "max_new_tokens" and rest[-1]["new_tokens"] == 25  # ran to the end
    swap_at = log.index(("swap", 0))  # the swap happened with an empty generator...
    assert log[swap_at - 1] == ("running", "streaming", True)  # ...right after the running job ended
    assert {name for name, *_ in log[:swap_at]} == {"running"}  # no deferred job started before it
    assert {name for name, *_ in log[swap_at + 1:]} == {"d0", "d1"}
    assert [tokens_of(o) for o in outs] == expected
    assert deferred[0].serial < deferred[1].serial  # enqueued in the order they were created
    assert pending_after is None and n_after == 0


def test_real_adapter_swap_applies_to_deferred_jobs_only(tiny, tmp_path):
    adapter = write_adapter(tmp_path / "style")
    p_running, p_deferred = prompt(9, seed=40), prompt(9, seed=41)
    base_running = sync_greedy(tiny, p_running, 20)
    base_deferred = sync_greedy(tiny, p_deferred, 8)
    lora_deferred = sync_greedy(tiny, p_deferred, 8, loras=[str(adapter)])
    assert lora_deferred != base_deferred  # the adapter visibly changes the output

    async def main():
        agen = make_async(tiny)
        try:
            running = DynamicJobAsync(agen, input_ids=p_running, max_new_tokens=20, gen_settings=GREEDY)
            head = [await running.__anext__()]
            swap = asyncio.create_task(agen.set_loras([str(adapter)]))
            await asyncio.sleep(0)
            deferred = DynamicJobAsync(agen, input_ids=p_deferred, max_new_tokens=8, gen_settings=GREEDY)
            running_results = head + await collect(running)
            await swap
            deferred_results = await collect(deferred)
            loras_on = agen.metrics()["loras"]
            # A bad adapter: the caller gets the loader's error; jobs deferred meanwhile run with the old set.
            running = DynamicJobAsync(agen, input_ids=p_running, max_new_tokens=5, gen_settings=GREEDY)
            await running.__anext__()
            bad = asyncio.create_task(agen.set_loras([str(tmp_path / "no-such-adapter")]))
            await asyncio.sleep(0)
            after_bad = DynamicJobAsync(agen, input_ids=p_deferred, max_new_tokens=8, gen_settings=GREEDY)
            with pytest.raises(FileNotFoundError, match="no-such-adapter"):
                await bad
            after_bad_results = await collect(after_bad)
            await collect(running)
            await agen.set_loras(None)  # idle now: applied at once, nothing pending, nothing deferred
            idle = (agen.pending_loras, agen.metrics()["loras"], agen.metrics()["deferred_jobs"])
            first = await DynamicJobAsync(agen, input_ids=p_deferred, max_new_tokens=2).__anext__()
            return running_results, deferred_results, loras_on, after_bad_results, idle, first
        finally:
            await agen.close()

    running_results, deferred_results, loras_on, after_bad_results, idle, first = run(main())
    assert tokens_of(running_results) == base_running  # the running job finished on the old (base) weights
    assert deferred_results[0]["stage"] == "deferred"
    assert tokens_of(deferred_results) == lora_deferred  # the deferred job ran with the new adapter
    assert loras_on == ["style"]
    assert after_bad_results[0]["stage"] == "deferred" and tokens_of(after_bad_results) == lora_deferred
    assert idle == (None, [], 0) and first["stage"] == "started"


def test_close_cancels_jobs_wakes_consumers_and_stops_the_worker(tiny):
    async def main():
        agen = make_async(tiny)
        running = DynamicJobAsync(agen, input_ids=prompt(10), max_new_tokens=500, gen_settings=GREEDY)
        await running.__anext__()
        consumer = asyncio.create_task(collect(running))
        swap = asyncio.create_task(agen.set_loras(None))
        await asyncio.sleep(0)
        deferred = DynamicJobAsync(agen, input_ids=prompt(10), max_new_tokens=5)
        await agen.close()
        rest = await consumer
        deferred_results = await collect(deferred)
        with pytest.raises(RuntimeError, match="closed"):
            await swap
        with pytest.raises(RuntimeError, match="closed"):
            DynamicJobAsync(agen, input_ids=prompt(4), max_new_tokens=2)
        return rest, deferred_results, agen._worker.is_alive(), agen.metrics()

    rest, deferred_results, alive, metrics = run(main())
    assert rest[-1]["eos_reason"] == "cancelled"
    assert [r["stage"] for r in deferred_results] == ["deferred", "streaming"]
    assert deferred_results[-1]["eos_reason"] == "cancelled"
    assert not alive
    assert metrics["active_jobs"] == 0 and metrics["pages_referenced"] == 0


def test_cancelling_a_deferred_job_ends_it_without_running_it(tiny):
    async def main():
        agen = make_async(tiny)
        try:
            running = DynamicJobAsync(agen, input_ids=prompt(6), max_new_tokens=15, gen_settings=GREEDY)
            await running.__anext__()
            swap = asyncio.create_task(agen.set_loras(None))
            await asyncio.sleep(0)
            dropped = DynamicJobAsync(agen, input_ids=prompt(6, seed=1), max_new_tokens=5, identifier="dropped")
            kept = DynamicJobAsync(agen, input_ids=prompt(6, seed=2), max_new_tokens=5, identifier="kept")
            assert agen.num_deferred == 2
            await dropped.cancel()
            n_after_cancel = agen.num_deferred
            dropped_results = await collect(dropped)
            await collect(running)
            await swap
            kept_results = await collect(kept)
            return n_after_cancel, dropped_results, kept_results, dropped.serial
        finally:
            await agen.close()

    n_after_cancel, dropped_results, kept_results, dropped_serial = run(main())
    assert n_after_cancel == 1
    assert [r["stage"] for r in dropped_results] == ["deferred", "streaming"]
    assert dropped_results[-1]["eos_reason"] == "cancelled" and dropped_serial is None  # never enqueued
    assert kept_results[-1]["eos_reason"] == "max_new_tokens"


def test_run_on_worker_runs_between_steps_on_the_worker_thread(tiny):
    async def main():
        agen = make_async(tiny)
        try:
            ident = await agen.run_on_worker(lambda gen: (threading.get_ident(), gen.num_remaining_jobs()))
            with pytest.raises(RuntimeError, match="needs an empty queue"):
                job = DynamicJobAsync(agen, input_ids=prompt(6), max_new_tokens=30, gen_settings=GREEDY)
                await job.__anext__()
                await agen.run_on_worker(lambda gen: gen.reset_page_table())
            await job.cancel()
            return ident, agen._worker.ident
        finally:
            await agen.close()

    (thread, remaining), worker = run(main())
    assert thread == worker and remaining == 0


def test_per_job_adapters_load_off_the_loop_and_unload_waits_for_its_jobs(tiny, tmp_path, monkeypatch):
    from engine.model.lora import LoRA

    adapter = write_adapter(tmp_path / "style")
    p_a, p_b = prompt(9, seed=50), prompt(9, seed=51)
    with_lora, base = sync_greedy(tiny, p_a, 12, loras=[str(adapter)]), sync_greedy(tiny, p_b, 12)
    load_threads = []
    inner_load = LoRA.load.__func__

    def load(cls, *args, **kw):
        load_threads.append(threading.current_thread())
        return inner_load(cls, *args, **kw)

    monkeypatch.setattr(LoRA, "load", classmethod(load))

    async def main():
        agen = make_async(tiny)
        try:
            style = await agen.load_lora(adapter)
            assert load_threads and load_threads[-1] not in (threading.current_thread(), agen._worker)
            # Hold the worker so the unload provably runs while job a is queued (no race with its steps).
            loop = asyncio.get_running_loop()
            gate1, gate2, held = threading.Event(), threading.Event(), asyncio.Event()

            def hold(g):
                loop.call_soon_threadsafe(held.set)
                gate2.wait()

            blocked = [asyncio.create_task(agen.run_on_worker(lambda g: gate1.wait()))]
            await asyncio.sleep(0)
            a = DynamicJobAsync(agen, input_ids=p_a, max_new_tokens=12, gen_settings=GREEDY, loras=[style])
            b = DynamicJobAsync(agen, input_ids=p_b, max_new_tokens=12, gen_settings=GREEDY, loras=[])
            log = []

            async def consume(job, name):
                results = await collect(job)
                log.append(name)
                return results

            consumers = [asyncio.create_task(consume(a, "a")), asyncio.create_task(consume(b, "b"))]
            unload = asyncio.create_task(agen.unload_lora("style"))
            await asyncio.sleep(0)  # its command is queued behind a's enqueue
            blocked.append(asyncio.create_task(agen.run_on_worker(hold)))
            await asyncio.sleep(0)
            gate1.set()
            await held.wait()  # the worker ran the unload (a still queued) and waits in hold()
            assert not unload.done()
            with pytest.raises(ValueError, match="being unloaded"):
                DynamicJobAsync(agen, input_ids=p_a, max_new_tokens=2, loras=["style"])
            gate2.set()
            await asyncio.gather(*blocked)
            await unload
            log.append("unloaded")
            results_a, results_b = await asyncio.gather(*consumers)
            return results_a, results_b, log, agen.metrics()["loras_loaded"]
        finally:
            await agen.close()

    results_a, results_b, log, loaded = run(main())
    assert tokens_of(results_a) == with_lora and tokens_of(results_b) == base  # one batch, two adapter sets
    assert results_a[-1]["eos_reason"] == "max_new_tokens" and results_a[-1]["loras"] == [("style", 1.0)]
    assert log.index("a") < log.index("unloaded") and loaded == []  # the unload waited for its job


def test_adapters_snapshot_shows_each_change_when_its_call_returns(tiny, tmp_path):
    """adapters() is published by the worker before an awaited load_lora / set_loras / unload_lora wakes its
    caller, so the caller reads its own change at once (the app's panels and the server rely on it)."""
    from engine.contract import AdapterSnapshot

    folder = write_adapter(tmp_path / "style")

    async def main():
        agen = make_async(tiny)
        try:
            snaps = [agen.adapters()]
            await agen.load_lora(folder)
            snaps.append(agen.adapters())
            await agen.set_loras(["style"], 0.5)
            snaps.append(agen.adapters())
            await agen.set_loras(None)
            snaps.append(agen.adapters())
            await agen.unload_lora("style")
            snaps.append(agen.adapters())
            return snaps
        finally:
            await agen.close()

    before, loaded, default, no_default, gone = run(main())
    assert all(isinstance(s, AdapterSnapshot) for s in (before, loaded, default, no_default, gone))
    assert before == AdapterSnapshot()
    assert dict(loaded.folders) == {"style": str(folder)} and loaded.default == () and not loaded.unloading
    assert loaded.available == {"style": str(folder)}
    assert dict(default.folders) == {"style": str(folder)} and default.default == (("style", 0.5),)
    assert dict(no_default.folders) == {"style": str(folder)} and no_default.default == ()
    assert dict(gone.folders) == {} and gone.available == {} and not gone.unloading and gone.default == ()

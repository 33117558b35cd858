"""`python -m engine serve` as a router over every model it finds, driven with the official `openai` client.

Each server is its own process over tiny random models in a temp folder (--models-dir; HOME and the hub cache
point at empty folders so the machine's own models stay out). Oracles: a model's greedy reply through the
server equals the engine's own greedy run of that model alone (tiny models of different seeds answer
differently, so a request served by the wrong model shows), and /v1/models says which models are loaded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.server_support import metric_samples
from tools.processes import free_port, stop, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)
CACHE_TOKENS = 1024
PROMPT = "Once upon a time"
NAMES = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """main (the --model one, outside the folder) and three others in models/, each of its own seed."""
    from tests.tiny_models import write_tiny_model

    root = tmp_path_factory.mktemp("pool")
    main = write_tiny_model(root / "main", seed=10)
    others = {name: write_tiny_model(root / "models" / name, seed=11 + i) for i, name in enumerate(NAMES)}
    return {"main": main, **others, "dir": root / "models", "root": root}


@pytest.fixture(scope="module")
def charge(folders) -> int:
    """What one tiny model counts against the budget: the engine's estimate, as the server computes it."""
    from engine.server.model_loader import ModelLoader

    sizes = {ModelLoader(cache_tokens=CACHE_TOKENS).charge_bytes(folders[n]) for n in ("main", *NAMES)}
    assert len(sizes) == 1 and sizes.pop() > 0
    return ModelLoader(cache_tokens=CACHE_TOKENS).charge_bytes(folders["main"])


class Served:
    def __init__(self, url: str, proc: subprocess.Popen | None, timeout: float = 300):
        self.url, self.proc, self.timeout = url, proc, timeout

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=self.timeout)

    def models(self) -> dict[str, dict]:
        with urllib.request.urlopen(self.url + "/v1/models", timeout=120) as r:
            return {m["id"]: m for m in json.loads(r.read())["data"]}

    def loaded(self) -> set[str]:
        return {name for name, m in self.models().items() if m["loaded"]}

    def complete(self, model: str, n: int = 8, **extra) -> str:
        r = self.client().completions.create(model=model, prompt=PROMPT, max_tokens=n, temperature=0,
                                             extra_body={"ignore_eos": True, **extra})
        return r.choices[0].text

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as r:
            return r.read().decode()


def serve(folders, *extra: str) -> Served:
    port = free_port()
    home = folders["root"] / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "OLLAMA_MODELS": str(home / "ollama"),
           "XDG_CACHE_HOME": str(home / "cache"), "XDG_DATA_HOME": str(home / "data")}
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(folders["main"]),
                             "--served-model-name", "main", "--models-dir", str(folders["dir"]),
                             "--port", str(port), "--threads", "1", "--cache-tokens", str(CACHE_TOKENS), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=300)
    except BaseException:
        stop(proc)
        raise RuntimeError(proc.stdout.read()[-4000:]) from None
    return Served(url, proc)


def finish(served: Served) -> None:
    stop(served.proc)
    log = served.proc.stdout.read()
    assert f'File "{ROOT / "engine"}' not in log, log[-4000:]  # no traceback of ours, whatever was asked


@pytest.fixture(scope="module")
def solo(folders):
    """name -> the engine's greedy completion of PROMPT by that model alone (stop at nothing)."""
    from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer

    memo = {}

    def run(name: str, n: int = 8) -> str:
        if (name, n) not in memo:
            model, tok = Model.load(folders[name]), Tokenizer.load(folders[name])
            gen = DynamicGenerator(model, PagedCache(model, max_tokens=CACHE_TOKENS, page_size=16), tok)
            gen.enqueue(DynamicJob(tok.encode(PROMPT), n, gen_settings=SamplerSettings.greedy(), stop_conditions=[]))
            text = ""
            while gen.num_remaining_jobs():
                text += "".join(r["text"] for r in gen.iterate() if r["stage"] == "streaming")
            memo[name, n] = text
        return memo[name, n]

    return run


@pytest.fixture(scope="module")
def router(folders):
    """No budget, no ttl: models load on demand and stay."""
    served = serve(folders)
    yield served
    finish(served)


# ------------------------------------------------------------------------------------------------ tests
def test_models_lists_every_found_model_with_loaded_and_memory(router, charge):
    models = router.models()
    assert list(models) == ["main", *NAMES]  # the --model one first (clients that take the first get it)
    assert models["main"]["loaded"] and models["main"]["pinned"]
    assert all(not models[n]["loaded"] and models[n]["status"] == "unloaded" for n in NAMES)
    assert all(m["memory_bytes"] == charge for m in models.values())
    assert [m.id for m in router.client().models.list().data] == ["main", *NAMES]


def test_unknown_model_is_a_404_in_openais_shape_naming_the_available_ones(router):
    with pytest.raises(openai.NotFoundError) as info:
        router.client().completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)
    error = info.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model" and error["type"] == "invalid_request_error"
    assert "no-such-model" in error["message"] and all(n in error["message"] for n in ("main", *NAMES))


def test_ttl_and_keep_alive_are_checked_and_read_as_idle_seconds(router):
    from engine.server.errors import ApiError
    from engine.server.lifetime import request_ttl

    assert request_ttl({}) == (False, None)
    assert request_ttl({"ttl": 90}) == (True, 90.0)
    assert request_ttl({"keep_alive": "1h30m"}) == (True, 5400.0)
    assert request_ttl({"keep_alive": "250ms"}) == (True, 0.25)
    assert request_ttl({"keep_alive": 0}) == (True, 0.0)
    assert request_ttl({"keep_alive": -1}) == (True, None)  # Ollama's "keep it loaded"
    assert request_ttl({"keep_alive": "-1m"}) == (True, None)
    for bad in ({"ttl": -1}, {"ttl": "5m"}, {"ttl": True}, {"keep_alive": "soon"}, {"keep_alive": "5m "},
                {"keep_alive": "1e3"}, {"keep_alive": [1]}, {"ttl": 5, "keep_alive": "5m"}):
        with pytest.raises(ApiError) as info:
            request_ttl(bad)
        assert info.value.status == 400, bad
    with pytest.raises(openai.BadRequestError, match="keep_alive"):
        router.complete("main", keep_alive="soon")


def test_first_request_loads_a_second_model_while_the_first_keeps_streaming(router, solo):
    assert "alpha" not in router.loaded()
    events: list[str] = []
    stream = router.client().completions.create(model="main", prompt=PROMPT, max_tokens=300, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    first = next(chunks).choices[0].text
    events.append("main streaming")
    got = router.complete("alpha")  # loads alpha (just in time) while main's stream is open
    events.append("alpha answered")
    rest = "".join(c.choices[0].text for c in chunks)
    events.append("main finished")
    assert got == solo("alpha")
    assert first + rest == solo("main", 300)  # main's stream went on, whole and right, across alpha's load
    assert events == ["main streaming", "alpha answered", "main finished"]
    assert {"main", "alpha"} <= router.loaded()


def test_two_models_stream_at_the_same_time_and_never_mix(router, solo):
    client = router.client()
    texts = {"beta": [], "gamma": []}
    first = {name: threading.Event() for name in texts}
    errors = []

    def run(name: str, other: str):
        try:
            stream = client.completions.create(model=name, prompt=PROMPT, max_tokens=120, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True})
            for i, c in enumerate(stream):
                texts[name].append(c.choices[0].text)
                if i == 0:
                    first[name].set()
                    assert first[other].wait(300), f"{other} never started while {name} was streaming"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            first[name].set()

    threads = [threading.Thread(target=run, args=pair) for pair in (("beta", "gamma"), ("gamma", "beta"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert "".join(texts["beta"]) == solo("beta", 120) and "".join(texts["gamma"]) == solo("gamma", 120)
    samples = metric_samples(router.metrics())
    assert samples  # labelled per model: each loaded model's own counters
    text = router.metrics()
    for name in ("main", "alpha", "beta", "gamma"):
        assert f'vllm:generation_tokens_total{{model_name="{name}"}}' in text
        assert f'pagedeck:model_loaded{{model_name="{name}"}} 1.0' in text


def test_lru_model_is_evicted_under_a_budget_and_the_pinned_one_stays(folders, charge, solo):
    served = serve(folders, "--max-memory", str(3 * charge + charge // 2))  # main + two others
    try:
        assert served.complete("alpha") == solo("alpha")
        assert served.complete("beta") == solo("beta")
        assert served.complete("alpha") == solo("alpha")  # alpha is now the more recently used
        assert served.loaded() == {"main", "alpha", "beta"}
        assert served.complete("gamma") == solo("gamma")
        assert served.loaded() == {"main", "alpha", "gamma"}  # beta, least recently used, made room
        assert served.complete("beta") == solo("beta")  # and comes back on demand, evicting alpha now
        assert served.loaded() == {"main", "gamma", "beta"}
        text = served.metrics()
        assert 'pagedeck:model_unloads_total{model_name="beta"} 1.0' in text
        assert 'pagedeck:model_loads_total{model_name="beta"} 2.0' in text
    finally:
        finish(served)


def test_pinned_model_is_never_evicted_and_idle_models_unload_after_their_ttl(folders, charge, solo):
    served = serve(folders, "--max-memory", str(2 * charge + charge // 2), "--ttl", "1")  # main + one other
    try:
        assert served.complete("alpha", keep_alive=-1) == solo("alpha")  # never idles out
        # main is the least recently used model, yet beta's load makes room by unloading alpha, never main
        assert served.complete("beta", ttl=3600) == solo("beta")
        assert served.loaded() == {"main", "beta"}
        assert served.complete("main") == solo("main")
        assert served.complete("gamma") == solo("gamma")  # evicts beta; gamma idles out after --ttl 1
        wait_for(lambda: served.loaded() == {"main"}, "gamma to unload after its ttl")
        assert served.complete("alpha", keep_alive=0) == solo("alpha")  # keep_alive 0: unload once idle
        wait_for(lambda: served.loaded() == {"main"}, "alpha to unload after keep_alive 0")
        models = served.models()
        assert models["main"]["loaded"] and not models["alpha"]["loaded"] and not models["gamma"]["loaded"]
    finally:
        finish(served)


def test_a_model_larger_than_the_budget_left_by_pinned_models_is_a_503_naming_why(folders, charge):
    served = serve(folders, "--max-memory", str(charge + charge // 2))
    try:
        with pytest.raises(openai.InternalServerError) as info:
            served.client().completions.create(model="alpha", prompt=PROMPT, max_tokens=2)
        assert info.value.status_code == 503 and info.value.body["code"] == "model_does_not_fit"
        assert "main" in info.value.body["message"]
        assert served.loaded() == {"main"}
        assert served.complete("main")  # still serving
    finally:
        finish(served)


def test_a_model_that_fails_to_load_is_an_error_listing_what_is_available(folders, router):
    """A model whose headers read well (so it is listed) but whose tensors are cut short: its load fails."""
    import shutil

    broken = folders["dir"] / "broken"
    shutil.copytree(folders["alpha"], broken)
    weights = broken / "model.safetensors"
    header = 8 + int.from_bytes(weights.read_bytes()[:8], "little")
    weights.write_bytes(weights.read_bytes()[: header + 64])
    try:
        assert not router.models()["broken"]["loaded"]
        with pytest.raises(openai.InternalServerError) as info:
            router.client().completions.create(model="broken", prompt=PROMPT, max_tokens=2)
        body = info.value.body
        assert info.value.status_code == 500 and body["code"] == "model_load_failed" and body["param"] == "model"
        assert "broken" in body["message"] and all(n in body["message"] for n in ("main", *NAMES))
        assert not router.models()["broken"]["loaded"]
    finally:
        shutil.rmtree(broken)
    assert "broken" not in router.models()  # gone from disk: gone from the list
    assert router.complete("main")


def wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


# ------------------------------------------------------------- in-process: what the loop does meanwhile
class PoolThread:
    """The router in this process (its own loop thread, as serve runs it), so a test can hold a load or a
    model's generator and see what the others do meanwhile."""

    def __init__(self, folders):
        import asyncio

        self.folders = folders
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = self.call(self._start())

    async def _start(self) -> str:
        from engine.model.catalog.discovery import find_models
        from engine.server import OpenAIServer
        from engine.server.model_loader import ModelLoader
        from engine.server.models_pool import ModelPool

        loader = ModelLoader(cache_tokens=CACHE_TOKENS)
        main = await loader.load(self.folders["main"], "main")
        home = self.folders["root"] / "home"
        self.pool = ModelPool(loader, discover=lambda: find_models([self.folders["dir"]], env={}, home=home,
                                                                  cache_tokens=CACHE_TOKENS))
        self.pool.add_loaded(main, self.folders["main"])
        await self.pool.refresh()
        self.server = OpenAIServer(main, pool=self.pool)
        return await self.server.start("127.0.0.1", 0)

    def call(self, coro, timeout: float = 300):
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        async def stop():
            await self.server.stop()
            await self.pool.close()
            await self.pool.models["main"].served.generator.close()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture
def pool_thread(folders):
    p = PoolThread(folders)
    yield p
    p.close()


def test_a_model_loading_holds_no_other_model_back(pool_thread, monkeypatch, solo):
    """alpha's load is stopped inside (reading its weights) until main has streamed a whole reply: a load on
    the event loop, or one that blocks other requests, would never let main's stream finish."""
    import engine.model.model_and_tokenizer as mt

    served = Served(pool_thread.url, None, timeout=60)
    real, entered, gate = mt.load_model_and_tokenizer, threading.Event(), threading.Event()

    def held(*args, **kwargs):
        entered.set()
        assert gate.wait(300)
        return real(*args, **kwargs)

    monkeypatch.setattr(mt, "load_model_and_tokenizer", held)
    result = {}
    asking = threading.Thread(target=lambda: result.setdefault("alpha", served.complete("alpha")))
    asking.start()
    try:
        assert entered.wait(120)
        assert served.models()["alpha"]["status"] == "loading"
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        stream = client.completions.create(model="main", prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        assert "".join(c.choices[0].text for c in stream) == solo("main", 40)
        assert "alpha" not in result
    finally:
        gate.set()
        asking.join(300)
    assert result["alpha"] == solo("alpha")
    assert served.loaded() == {"main", "alpha"}


def test_a_model_whose_generator_is_held_holds_no_other_model_back(pool_thread, solo):
    """beta's generator is stopped between steps and a request to beta waits: gamma's request still gets its
    whole reply (its own generator), and beta's reply then comes as if nothing happened."""
    import asyncio

    served = Served(pool_thread.url, None, timeout=60)
    assert served.complete("beta") == solo("beta")  # loaded
    beta = pool_thread.pool.models["beta"].served.generator
    holding, release = threading.Event(), threading.Event()

    def hold(_gen):
        holding.set()
        release.wait(300)

    held = asyncio.run_coroutine_threadsafe(beta.run_on_worker(hold), pool_thread.loop)
    result = {}
    asking = threading.Thread(target=lambda: result.setdefault("beta", served.complete("beta", 16)))
    try:
        assert holding.wait(120)
        asking.start()
        wait_for(lambda: pool_thread.pool.models["beta"].active == 1, "beta's request to reach the server")
        assert served.complete("gamma") == solo("gamma")
        assert "beta" not in result
    finally:
        release.set()
        held.result(120)
        asking.join(300)
    assert result["beta"] == solo("beta", 16)

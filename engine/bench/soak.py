"""`python -m engine soak`: a long, rough run against a real `python -m engine serve` process on loopback.

N concurrent clients (default 64) for a duration (default 10 min) mix streaming and non-streaming chats,
short and long prompts, raw completions, streams dropped after a few chunks, requests abandoned before
their answer (the connection closes: a cancel), deliberately bad requests, and requests to a LoRA adapter
that a separate task loads and unloads all the while (vLLM's /v1/load_lora_adapter API).

Reported: requests served, errors asked for (400 for the bad requests, 404 for the adapter while it is
unloaded, the drops and cancels) and errors not asked for (anything else: a 5xx, a wrong status, a body
not in OpenAI's shape, a broken connection), TTFT p50/p99 of the streamed chats, the server's RSS every
interval and the pages referenced at the end. Exit status 1 when an error was not asked for, when the
pages don't come back to zero, or when RSS grows more than --leak-mb per 1000 requests after warm-up.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = "soak-lora"
WORDS = "the paged cache keeps every reply in pages that return to the pool when a request ends".split()


@dataclass
class Tally:
    served: int = 0
    asked: dict[str, int] = field(default_factory=dict)  # errors the bench asked for, by kind
    unexpected: list[str] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    adapter_cycles: int = 0
    load_retries: int = 0  # loads refused while the last unload still waited for its requests

    def ask(self, kind: str) -> None:
        self.asked[kind] = self.asked.get(kind, 0) + 1

    @property
    def requests(self) -> int:
        return self.served + sum(self.asked.values()) + len(self.unexpected)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def is_openai_error(body) -> bool:
    err = body.get("error") if isinstance(body, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"] and "type" in err


class Clients:
    def __init__(self, url: str, model: dict, tally: Tally, rng: random.Random, adapter: bool):
        self.url, self.model, self.max_len = url, model["id"], model.get("max_model_len", 2048)
        self.tally, self.rng, self.adapter = tally, rng, adapter

    def _prompt(self, long: bool) -> str:
        most = min(600, self.max_len // 4)  # long: up to ~1.5 tokens a word, room left for the reply
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(most // 2, most) if long else
                                                                 self.rng.randint(3, 20)))

    async def one(self, http: aiohttp.ClientSession) -> None:
        r, t = self.rng.random(), self.tally
        max_tokens = self.rng.randint(4, 24)
        chat = {"model": self.model, "max_tokens": max_tokens, "temperature": 0.7,
                "messages": [{"role": "user", "content": self._prompt(long=self.rng.random() < 0.15)}]}
        if r < 0.30:
            await self._json(http, "/v1/chat/completions", chat)
        elif r < 0.55:
            await self._stream(http, chat)
        elif r < 0.65:
            await self._json(http, "/v1/completions", {"model": self.model, "prompt": self._prompt(True),
                                                       "max_tokens": max_tokens})
        elif r < 0.75:
            await self._stream(http, {**chat, "max_tokens": 64}, drop_after=2)
        elif r < 0.83:  # abandoned before the answer: the client closes the connection, the server cancels
            try:
                await asyncio.wait_for(self._json(http, "/v1/chat/completions", {**chat, "max_tokens": 64}),
                                       self.rng.uniform(0.05, 0.5))
            except asyncio.TimeoutError:
                t.ask("cancelled")
        elif r < 0.90:  # asked-for 400s
            bad = self.rng.choice([{**chat, "temperature": 7}, {**chat, "messages": []},
                                   {**chat, "max_tokens": 10**7}, {**chat, "frobnicate": 1}])
            await self._json(http, "/v1/chat/completions", bad, expect=400)
        elif self.adapter:
            await self._json(http, "/v1/chat/completions", {**chat, "model": ADAPTER}, may_404=True)
        else:
            await self._stream(http, chat)

    async def _json(self, http, path: str, body: dict, expect: int | None = None, may_404: bool = False) -> None:
        t = self.tally
        try:
            async with http.post(self.url + path, json=body) as resp:
                data = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, json.JSONDecodeError) as exc:
            t.unexpected.append(f"{path}: {type(exc).__name__}: {exc}")
            return
        if status == 200 and expect is None:
            if data.get("choices"):
                t.served += 1
            else:
                t.unexpected.append(f"{path}: 200 without choices: {str(data)[:200]}")
        elif (status == expect or (may_404 and status == 404)) and is_openai_error(data):
            t.ask(f"{status} {'adapter unloaded' if status == 404 else 'bad request'}")
        else:
            t.unexpected.append(f"{path}: {status}: {str(data)[:300]}")

    async def _stream(self, http, body: dict, drop_after: int | None = None) -> None:
        t, t0, chunks, first = self.tally, time.perf_counter(), 0, None
        try:
            async with http.post(self.url + "/v1/chat/completions", json={**body, "stream": True}) as resp:
                if resp.status != 200:
                    t.unexpected.append(f"stream: {resp.status}: {(await resp.text())[:300]}")
                    return
                async for line in resp.content:
                    if not line.startswith(b"data: "):
                        continue
                    payload = line[6:].strip()
                    if payload == b"[DONE]":
                        break
                    obj = json.loads(payload)
                    if "error" in obj:
                        t.unexpected.append(f"stream error event: {obj}")
                        return
                    if first is None and obj["choices"] and obj["choices"][0]["delta"].get("content"):
                        first = time.perf_counter() - t0
                    chunks += 1
                    if drop_after is not None and chunks >= drop_after:
                        resp.close()  # drop the connection mid-stream
                        t.ask("dropped mid-stream")
                        return
        except (aiohttp.ClientError, json.JSONDecodeError, KeyError) as exc:
            t.unexpected.append(f"stream: {type(exc).__name__}: {exc}")
            return
        if first is not None:
            t.ttft.append(first)
        t.served += 1

    async def adapter_churn(self, http, folder: Path, deadline: float, period: float) -> None:
        """Load the adapter, let requests use it, unload it while they may still run; again until the end."""
        while time.monotonic() < deadline - period:
            for path, body in (("/v1/load_lora_adapter", {"lora_name": ADAPTER, "lora_path": str(folder)}),
                               ("/v1/unload_lora_adapter", {"lora_name": ADAPTER})):
                while True:
                    async with http.post(self.url + path, json=body) as resp:
                        text = await resp.text()
                    # An unloaded adapter's name stays taken until the requests running with it finish.
                    if resp.status == 400 and "already been loaded" in text:
                        if time.monotonic() > deadline:
                            return
                        self.tally.load_retries += 1  # not a client request: not counted as one
                        await asyncio.sleep(1.0)
                        continue
                    break
                if resp.status != 200:
                    self.tally.unexpected.append(f"{path}: {resp.status}: {text[:300]}")
                    return
                await asyncio.sleep(period / 2)
            self.tally.adapter_cycles += 1


async def metric(http, url: str, name: str) -> float:
    async with http.get(url + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


async def soak(url: str, pid: int, args: argparse.Namespace, log=print) -> dict:
    tally, rng = Tally(), random.Random(args.seed)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        async with http.get(url + "/v1/models") as resp:
            model = (await resp.json())["data"][0]
        clients = Clients(url, model, tally, rng, args.adapter is not None)
        start = time.monotonic()
        deadline = start + args.duration

        async def client() -> None:
            while time.monotonic() < deadline:
                await clients.one(http)

        tasks = [asyncio.ensure_future(client()) for _ in range(args.clients)]
        if args.adapter is not None:
            tasks.append(asyncio.ensure_future(clients.adapter_churn(http, args.adapter, deadline,
                                                                     min(20.0, args.duration / 3))))
        samples = [(0.0, tally.requests, rss_mb(pid))]
        while not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=args.every)
            samples.append((time.monotonic() - start, tally.requests, rss_mb(pid)))
            log(f"  {samples[-1][0]:6.0f} s  {tally.requests:6d} requests  {tally.served:6d} served  "
                f"RSS {samples[-1][2]:7.1f} MB  unexpected {len(tally.unexpected)}")
        for t in tasks:
            t.result()
        referenced = 1.0
        for _ in range(100):  # the last cancels reach the generator within a step or two
            referenced = await metric(http, url, "pagedeck:pages_referenced")
            if referenced == 0:
                break
            await asyncio.sleep(0.2)
        healthy = (await http.get(url + "/health")).status == 200
    after = samples[min(len(samples) - 1, max(1, round(len(samples) * args.warmup))):]
    grown_requests = after[-1][1] - after[0][1]
    leak = growth_per_1000(after)
    judged = grown_requests >= args.leak_min_requests and len(after) >= 3
    ttft = sorted(tally.ttft)
    report = {
        "clients": args.clients, "duration_s": args.duration, "requests": tally.requests, "served": tally.served,
        "asked_errors": tally.asked, "unexpected_errors": len(tally.unexpected), "unexpected": tally.unexpected[:20],
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 1) if ttft else None,
        "ttft_p99_ms": round(ttft[min(len(ttft) - 1, int(len(ttft) * 0.99))] * 1000, 1) if ttft else None,
        "rss_mb": [(round(s), n, round(m, 1)) for s, n, m in samples], "adapter_cycles": tally.adapter_cycles,
        "adapter_load_retries": tally.load_retries,
        "rss_growth_mb_per_1000_after_warmup": round(leak, 2), "leak_judged": judged,
        "pages_referenced_at_end": referenced, "healthy_at_end": healthy,
    }
    report["ok"] = (not tally.unexpected and referenced == 0 and healthy and tally.served > 0
                    and (not judged or leak <= args.leak_mb))
    return report


def growth_per_1000(samples: list[tuple[float, int, float]]) -> float:
    """RSS growth in MB per 1000 requests: the least-squares slope of RSS over requests served so far (a
    two-point difference would judge the allocator's ups and downs, not a trend)."""
    xs, ys = [s[1] for s in samples], [s[2] for s in samples]
    if len(xs) < 2 or max(xs) == min(xs):
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs) * 1000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine soak", description=__doc__.splitlines()[0])
    ap.add_argument("--model", metavar="PATH", help="served model (default: the embedded SmolLM2)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600.0, metavar="S", help="seconds (default 600)")
    ap.add_argument("--every", type=float, default=60.0, metavar="S", help="RSS sample interval (default 60)")
    ap.add_argument("--warmup", type=float, default=0.2, metavar="F",
                    help="fraction of the samples before the leak baseline (default 0.2)")
    ap.add_argument("--leak-mb", type=float, default=5.0, metavar="MB",
                    help="RSS growth per 1000 requests after warm-up that fails the run (default 5)")
    ap.add_argument("--leak-min-requests", type=int, default=1000,
                    help="judge the leak only over at least this many requests (default 1000)")
    ap.add_argument("--adapter", type=Path, metavar="DIR",
                    help="PEFT adapter loaded/unloaded during the run (default: resources/loras/pirate with the "
                         "default model, none otherwise); 'none' for no churn")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--weights", default=None, help="the server's --weights (default: its own default, auto)")
    ap.add_argument("--cache-tokens", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object on the last line")
    args = ap.parse_args(argv)
    if args.adapter is None and args.model is None:
        args.adapter = ROOT / "resources" / "loras" / "pirate"
    if args.adapter is not None and str(args.adapter) == "none":
        args.adapter = None
    return args


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str, list[str]]:
    """`python -m engine serve --port 0` in its own process; its URL read off its "serving ... at URL" line,
    its stderr drained by a thread (kept, to look for tracebacks at the end)."""
    cmd = [sys.executable, "-m", "engine", "serve", "--port", "0", "--cache-tokens", str(args.cache_tokens)]
    cmd += ["--model", str(args.model)] if args.model else []
    cmd += ["--threads", str(args.threads)] if args.threads else []
    cmd += ["--weights", args.weights] if args.weights else []
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: list[str] = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("serving ") and " at http" in line:
            url = line.split(" at ", 1)[1].split()[0].removesuffix("/v1")
            break
    else:
        raise RuntimeError("the server exited before serving:\n" + "".join(lines[-30:]))
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    return proc, url, lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    proc, url, server_log = start_server(args)
    try:
        print(f"soak: {args.clients} clients for {args.duration:.0f} s against {url} (server pid {proc.pid})",
              flush=True)
        report = asyncio.run(soak(url, proc.pid, args, log=lambda s: print(s, flush=True)))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    if "Traceback" in "".join(server_log):
        report["ok"] = False
        report["server_tracebacks"] = "".join(server_log)[-3000:]
    print(json.dumps(report, indent=None if args.json else 1))
    print("soak: OK" if report["ok"] else "soak: FAILED", flush=True)
    return 0 if report["ok"] else 1

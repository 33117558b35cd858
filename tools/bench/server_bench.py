"""`python -m tools.bench.server_bench`: N concurrent streamed chat requests against pagedeck's server and,
in the same run, against vLLM (CPU build) serving the same model: aggregate tok/s, TTFT p50/p99.

Each server runs in its own process (`python -m engine serve`, `vllm serve`), all are started first and
then measured in alternating rounds, so drift of a shared machine hits every side alike; medians over
rounds are reported. Every request streams `--max-tokens` tokens (ignore_eos) from its own prompt at
temperature 0, so all sides do the same work. TTFT is request sent -> first content event; aggregate
tok/s is all generated tokens / wall time from the first request to the last token.

    python -m tools.bench.server_bench --with-vllm [--threads 1]  # pagedeck dense + q4, vLLM (make test-vllm builds it)
    python -m tools.bench.server_bench --vllm-url http://127.0.0.1:8000
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

from engine.contract import WEIGHT_NAMES

from tools.processes import free_port, stop, wait_healthy

TOPICS = ("the sea", "a mountain", "bread", "a violin", "rain", "a library", "trains", "bees", "winter", "a market",
          "clocks", "the moon", "a garden", "bridges", "salt", "kites", "owls", "a river", "glass", "maps")


def start_pagedeck(weights: str, threads: int | None) -> tuple[str, subprocess.Popen]:
    port = free_port()
    cmd = [sys.executable, "-m", "engine", "serve", "--port", str(port), "--weights", weights, "--cache-tokens", "16384"]
    proc = subprocess.Popen(cmd + (["--threads", str(threads)] if threads else []), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return url, proc


async def one_round(url: str, streams: int, max_tokens: int) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/v1/models") as r:
            model = (await r.json())["data"][0]["id"]

        async def request(i: int) -> tuple[float, int, float]:
            body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
                    "messages": [{"role": "user", "content": f"Write a long essay about {TOPICS[i % len(TOPICS)]}."}],
                    "stream_options": {"include_usage": True}}
            t0 = time.perf_counter()
            first, tokens = None, 0
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                resp.raise_for_status()
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
                    if first is None and any((c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                        first = time.perf_counter() - t0
            return first, tokens, time.perf_counter()

        t0 = time.perf_counter()
        results = await asyncio.gather(*(request(i) for i in range(streams)))
    ttfts = sorted(r[0] for r in results)
    total = sum(r[1] for r in results)
    wall = max(r[2] for r in results) - t0
    return {"tok_s": total / wall, "tokens": total, "wall_s": wall, "ttft_p50_s": _pct(ttfts, 50),
            "ttft_p99_s": _pct(ttfts, 99)}


def _pct(values: list[float], p: float) -> float:
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


DEFAULT_WEIGHTS = ("dense", "packed")  # one pagedeck server each; `engine serve --weights` must take them


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per server (medians reported)")
    ap.add_argument("--weights", nargs="+", choices=WEIGHT_NAMES, default=list(DEFAULT_WEIGHTS),
                    help="pagedeck weight formats to serve, one server each (default: dense packed)")
    ap.add_argument("--threads", type=int, help="torch threads of the pagedeck servers (vLLM-CPU binds one core "
                                               "to its engine by itself)")
    ap.add_argument("--vllm-url", help="a running vLLM serving the same model")
    ap.add_argument("--with-vllm", action="store_true", help="start vLLM from .vllm/ (make test-vllm builds it)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    servers: dict[str, str] = {}
    procs: list[subprocess.Popen] = []
    try:
        for weights in args.weights:
            url, proc = start_pagedeck(weights, args.threads)
            servers[f"pagedeck {weights}"], procs = url, procs + [proc]
        if args.with_vllm:
            root = Path(__file__).resolve().parents[2]
            sys.path.insert(0, str(root))
            from tools.peers import vllm_server

            vllm_server.ensure_venv()
            vllm_server.ensure_model()
            port = free_port()
            proc = vllm_server.start(port)
            procs.append(proc)
            wait_healthy(f"http://127.0.0.1:{port}", proc)
            servers["vLLM-CPU fp32"] = f"http://127.0.0.1:{port}"
        elif args.vllm_url:
            servers["vLLM"] = args.vllm_url.rstrip("/").removesuffix("/v1")
        for url in servers.values():  # warm-up: first requests pay for lazy initialisation
            asyncio.run(one_round(url, 2, 8))
        rounds: dict[str, list[dict]] = {name: [] for name in servers}
        for _ in range(args.rounds):
            for name, url in servers.items():
                rounds[name].append(asyncio.run(one_round(url, args.streams, args.max_tokens)))
                print(f"{name}: {rounds[name][-1]}", file=sys.stderr, flush=True)
    finally:
        for proc in procs:
            stop(proc)
    table = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rounds.items()}
    if args.json:
        print(json.dumps(table))
    else:
        print(f"{args.streams} concurrent streams x {args.max_tokens} tokens, median of {args.rounds} rounds")
        print(f"{'server':<16} {'tok/s':>8} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12}")
        for name, r in table.items():
            print(f"{name:<16} {r['tok_s']:8.1f} {r['ttft_p50_s'] * 1e3:12.0f} {r['ttft_p99_s'] * 1e3:12.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

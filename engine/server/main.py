"""`python -m engine serve`: load a model, serve it and every other model found until Ctrl-C / SIGTERM.

The --model one loads at start and stays loaded (pinned); the others (engine.find_models' list, plus
--models-dir folders) load when a request names them and unload when idle (--ttl) or to make room
(--max-memory): engine.server.models_pool.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from .. import envs
from .model_loader import load_vision_of, model_id  # noqa: F401 - serve's names, kept importable from here

DEFAULT_PORT = 8399
DEFAULT_CACHE_TOKENS = 32768  # 128 pages: 16 requests of ~1k tokens each fit at once (budgets are reserved)
PAGE_SIZE = 256


def add_serve_parser(sub, weight_formats) -> None:
    s = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    s.add_argument("--model", metavar="PATH", help="HF model folder or .gguf file (default: the embedded SmolLM2)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free port)")
    s.add_argument("--api-key", metavar="KEY", default=envs.PAGEDECK_API_KEY,
                   help="require 'Authorization: Bearer KEY' on /v1 routes (default: $PAGEDECK_API_KEY, else none)")
    s.add_argument("--weights", choices=weight_formats, default="auto",
                   help="auto (default): a GGUF's 4-bit blocks in the CPU matmuls, else dense; dense: exact fp32")
    s.add_argument("--cache-tokens", type=int, default=DEFAULT_CACHE_TOKENS, metavar="N",
                   help=f"K/V cache size in tokens, shared by all requests (default {DEFAULT_CACHE_TOKENS})")
    s.add_argument("--chat-template", metavar="NAME|FILE", default="auto",
                   help="prompt format: auto (the model's own template, else its family's, else plain completion), "
                        "model, chatml, llama3, gemma, phi3, mistral, plain, or a Jinja file")
    s.add_argument("--served-model-name", metavar="NAME", help="the model id clients send (default: the file name)")
    s.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="a PEFT adapter served as model NAME (repeatable)")
    s.add_argument("--threads", type=int, metavar="N",
                   help="torch CPU threads (default: torch's choice; on a busy machine 1 can be faster)")
    s.add_argument("--allow-remote-images", action="store_true",
                   help="let image_url parts name http(s) URLs, fetched by the server (size and time limited); "
                        "off by default: only data: URLs")
    s.add_argument("--default-max-tokens", type=int, default=None, metavar="N",
                   help="max_tokens of a request that gives none (default: until the context is full)")
    s.add_argument("--models-dir", action="append", default=[], metavar="DIR",
                   help="also serve the models (GGUF files, HF folders) under DIR, loaded when a request names "
                        "them (repeatable); the usual model folders (HF cache, LM Studio, GPT4All, Ollama) always")
    s.add_argument("--ttl", type=float, default=None, metavar="SECONDS",
                   help="unload a model loaded on demand after it has been idle this long (default: never; a "
                        "request's ttl or keep_alive sets its model's); the --model one stays loaded")
    s.add_argument("--max-memory", metavar="SIZE", default=None,
                   help="memory budget of the loaded models, e.g. 12G (default: what is free once the --model "
                        "one is loaded, plus its share); the least recently used idle model is unloaded to "
                        "make room for another")


def parse_loras(specs: list[str]) -> dict[str, Path]:
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora takes NAME=PATH, got {spec!r}")
        out[name] = Path(path)
    return out


async def serve(args: argparse.Namespace, ready=None) -> None:
    """Build everything, serve until a stop signal (or `ready`'s caller cancels); `ready(url)` once listening."""
    from ..model.chat_format import check_chat_format
    from .app import OpenAIServer
    from .lifetime import parse_size
    from .model_loader import ModelLoader
    from .models_pool import ModelPool

    if args.cache_tokens < PAGE_SIZE:
        raise ValueError(f"--cache-tokens must be at least one page ({PAGE_SIZE})")
    loras = parse_loras(args.lora)
    check_chat_format(args.chat_template)  # a bad name or a missing file fails before the model loads
    budget = parse_size(args.max_memory) if getattr(args, "max_memory", None) else None
    ttl = getattr(args, "ttl", None)
    if ttl is not None and ttl < 0:
        raise ValueError(f"--ttl must be >= 0 seconds, got {ttl}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    loader = ModelLoader(weights=args.weights, cache_tokens=args.cache_tokens, chat_template=args.chat_template,
                         page_size=PAGE_SIZE)
    served = await loader.load(args.model, args.served_model_name)
    generator = served.generator
    pool = None
    try:
        for name, path in loras.items():
            await generator.load_lora(path, name)
        pool = ModelPool(loader, budget=budget, default_ttl=ttl,
                         discover=lambda: discover_models(getattr(args, "models_dir", []), loader))
        pinned = pool.add_loaded(served, args.model)
        if pool.budget is None:
            pool.budget = default_budget(pinned.charge, loader.device)
        await pool.refresh()
        server = OpenAIServer(served, api_key=args.api_key, default_max_tokens=args.default_max_tokens,
                              allow_remote_images=getattr(args, "allow_remote_images", False), pool=pool)
        url = await server.start(args.host, args.port)
        vision = served.vision
        others = len(pool.models) - 1
        print(f"serving {served.name} at {url}/v1 (models: {', '.join(e['id'] for e in served.model_entries())})"
              + f" · prompt format: {served.tokenizer.chat_format.label}"
              + (f" · sees images ({vision.kind})" if vision is not None else "")
              + (" · API key required" if args.api_key else ""), file=sys.stderr, flush=True)
        print(f"{others} more model(s) load on demand · memory budget "
              + (f"{pool.budget / 2**30:.1f} GiB" if pool.budget is not None else "unlimited")
              + (f" · idle ttl {ttl:g}s" if ttl is not None else ""), file=sys.stderr, flush=True)
        if ready is not None:
            ready(url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # not the main thread / not supported here
                pass
        try:
            await stop.wait()
        finally:
            await server.stop()
    finally:
        if pool is not None:
            await pool.close()
        await generator.close()


def discover_models(folders, loader) -> list:
    """engine.find_models over the usual folders and `folders`, estimated as `loader` would load them."""
    from ..model.catalog.discovery import find_models

    return find_models([Path(f) for f in folders], cache_tokens=loader.cache_tokens, weights=loader.weights,
                       device=loader.device)


def default_budget(pinned_bytes: int, device: str = "cpu") -> int | None:
    """What the loaded models may hold by default: the pinned model's share plus what is still free (less
    the engine's headroom); None when free memory is unknown."""
    from ..cache.budget import HEADROOM, available_bytes

    free = available_bytes(device)
    return None if free is None else pinned_bytes + int(free * HEADROOM)


def run_serve(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0

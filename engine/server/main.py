"""`python -m engine serve`: load a model, build one generator and serve it until Ctrl-C / SIGTERM."""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from .. import envs

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
    s.add_argument("--default-max-tokens", type=int, default=1024, metavar="N",
                   help="max_tokens of a chat request that gives none (default 1024, capped by the context)")


def model_id(model) -> str:
    name = str(model.name)
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


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
    from ..generator.async_api import DynamicGeneratorAsync
    from ..cache.paged_cache import PagedCache
    from ..model.model_and_tokenizer import load_model_and_tokenizer
    from ..model.chat_format import check_chat_format
    from .app import OpenAIServer
    from .served import ServedModel

    if args.cache_tokens < PAGE_SIZE:
        raise ValueError(f"--cache-tokens must be at least one page ({PAGE_SIZE})")
    loras = parse_loras(args.lora)
    check_chat_format(args.chat_template)  # a bad name or a missing file fails before the model loads
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    model, tokenizer = await asyncio.to_thread(load_model_and_tokenizer, args.model, weights=args.weights)
    vision = await asyncio.to_thread(load_vision_of, args.model)  # None: a text-only model
    chat_format = tokenizer.set_chat_format(args.chat_template)
    cache = PagedCache(model, max_tokens=args.cache_tokens, page_size=PAGE_SIZE)
    generator = DynamicGeneratorAsync(model=model, cache=cache, tokenizer=tokenizer)
    try:
        for name, path in loras.items():
            await generator.load_lora(path, name)
        await generator.run_on_worker(lambda g: g.warmup())
        served = ServedModel(generator, tokenizer, args.served_model_name or model_id(model), vision=vision)
        server = OpenAIServer(served, api_key=args.api_key, default_max_tokens=args.default_max_tokens,
                              allow_remote_images=getattr(args, "allow_remote_images", False))
        url = await server.start(args.host, args.port)
        print(f"serving {served.name} at {url}/v1 (models: {', '.join(e['id'] for e in served.model_entries())})"
              + f" · prompt format: {chat_format.label}"
              + (f" · sees images ({vision.kind})" if vision is not None else "")
              + (" · API key required" if args.api_key else ""), file=sys.stderr, flush=True)
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
        await generator.close()


def load_vision_of(path) -> object | None:
    """The model's vision encoder (an HF VLM folder's vision tower, or an mmproj GGUF beside the model
    GGUF), or None: no model path (the embedded default) or a text-only model."""
    if not path:
        return None
    from ..vision import load_vision

    try:
        return load_vision(path)
    except Exception as exc:  # noqa: BLE001 - the language model still serves text
        print(f"the vision encoder did not load, serving text only: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def run_serve(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0

"""`python -m engine generate|serve|batch|bench|bench-spec|bench-load`: talk to a model from a terminal, serve it over an
OpenAI-compatible API (engine.server), run a template over a file of inputs (engine.batch), or measure the engine (engine.bench.serving; bench-spec is
engine.bench.speculative's own parser and bench-load engine.bench.load's, dispatched from here).

Expected failures (bad model path, bad sampler values, a prompt too long for the model) print one
`error: ...` line on stderr and exit 1; argparse usage errors exit 2. A traceback means a bug.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence

from .contract import DEFAULT_PAGE_SIZE, WEIGHT_NAMES, check_model_path

# What a user can cause: reported as one line, never as a traceback.
USER_ERRORS = (OSError, ValueError, NotImplementedError, ImportError, MemoryError)

SAMPLER_FLAGS = {  # CLI flag -> SamplerSettings field
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "token_repetition_penalty",
}


def add_sampler_arguments(parser: argparse.ArgumentParser, seed_help: str) -> None:
    """--greedy, the SAMPLER_FLAGS and --seed, as every generating command takes them (sampler_from_args
    reads them back)."""
    parser.add_argument("--greedy", action="store_true", help="argmax decoding (no sampler options allowed)")
    kinds = {"top_k": (int, "K"), "temperature": (float, "T"), "top_p": (float, "P"), "min_p": (float, "M"),
             "repetition_penalty": (float, "R")}
    for flag in SAMPLER_FLAGS:
        kind, metavar = kinds[flag]
        parser.add_argument("--" + flag.replace("_", "-"), type=kind, metavar=metavar)
    parser.add_argument("--seed", type=int, metavar="S", help=seed_help)


class CLIError(Exception):
    """A user error found by the CLI itself (before the engine sees the request)."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="pagedeck's engine from the command line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{generate,serve,batch,bench,bench-spec}")

    g = sub.add_parser("generate", help="generate text (streamed to stdout)")
    g.add_argument("--model", metavar="PATH", help="HF model folder or .gguf file (default: the embedded SmolLM2)")
    g.add_argument("--weights", choices=WEIGHT_NAMES, default="auto",
                   help="auto (default): a GGUF's 4-bit blocks in the CPU matmuls, else dense; dense: exact fp32")
    what = g.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", metavar="TEXT", help="raw text to continue")
    what.add_argument("--chat", metavar="TEXT", help="a user message, formatted with the model's chat template")
    g.add_argument("--system", metavar="TEXT", help="system prompt (with --chat)")
    g.add_argument("--chat-template", metavar="NAME|FILE", default="auto",
                   help="prompt format of --chat: auto (the model's own, else its family's, else plain completion), "
                        "model, chatml, llama3, gemma, phi3, mistral, plain, or a Jinja file")
    g.add_argument("--max-new-tokens", type=_positive_int, default=256, metavar="N")
    add_sampler_arguments(g, seed_help="makes sampling reproducible")
    g.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming")

    from .server.main import add_serve_parser

    add_serve_parser(sub, WEIGHT_NAMES)

    from .batch.cli_run import add_batch_parser

    add_sampler_arguments(add_batch_parser(sub, WEIGHT_NAMES),
                          seed_help="row i is sampled with seed S + i (reproducible)")

    b = sub.add_parser("bench", help="measure decode speed, concurrency and prefix-cache TTFT")
    b.add_argument("--model", metavar="PATH",
                   help="HF model folder, .gguf file, or a synthetic random model: "
                        "llama3-8b-random or smollm2-135m-random (default: the embedded SmolLM2)")
    b.add_argument("--streams", type=_positive_int, default=8, metavar="N", help="concurrent streams (default 8)")
    b.add_argument("--prompt-tokens", type=_positive_int, default=128, metavar="P",
                   help="prompt length of the decode and streams runs (default 128)")
    b.add_argument("--new-tokens", type=_positive_int, default=64, metavar="G",
                   help="tokens generated per request (default 64)")
    b.add_argument("--shared-prefix", type=_positive_int, default=1024, metavar="P",
                   help="length of the shared prefix in the TTFT runs (default 1024)")
    b.add_argument("--tail-tokens", type=_positive_int, default=32, metavar="T",
                   help="tokens after the shared prefix that differ between the TTFT requests (default 32)")
    b.add_argument("--threads", type=_positive_int, metavar="N",
                   help="torch CPU threads for both sides (default: torch's choice; on a shared machine 1 can be "
                        "much faster)")
    b.add_argument("--weights", choices=WEIGHT_NAMES, default="dense",
                   help="dense: dequantized to the model dtype (default); packed (or q4): a GGUF's quantized blocks "
                        "in the matmuls; q8: every matrix as Q8_0; auto: packed for a GGUF on a CPU")
    b.add_argument("--peer", choices=["transformers", "llama.cpp"],
                   help="also measure this implementation on the same model and token ids (llama.cpp: a .gguf; "
                        "needs pagedeck[peers])")
    b.add_argument("--repeats", type=_positive_int, default=3, metavar="R",
                   help="measurement sets per side, alternating engine and peer; figures are medians (default 3)")
    b.add_argument("--paste", type=_positive_int, metavar="N",
                   help="instead: the other chats' decode rate while one chat prefills an N-token paste "
                        "(engine.bench.paste)")
    b.add_argument("--paste-others", type=_positive_int, default=3, metavar="K",
                   help="chats decoding during --paste (default 3)")
    b.add_argument("--alternatives", type=_positive_int, metavar="N",
                   help="instead: N replies to one prompt at once vs one reply and vs N one after another "
                        "(engine.bench.alternatives)")
    b.add_argument("--json", action="store_true", help="print one JSON object on the last line")

    # Listed for --help only: main() hands its arguments to engine.bench.speculative, which parses them itself.
    sub.add_parser("bench-spec", add_help=False,
                   help="speculative decoding (n-gram) speed-up by batch size; see `bench-spec --help`")
    sub.add_parser("soak", add_help=False,
                   help="a long, rough run of many clients against `serve` (RSS, errors, TTFT); see `soak --help`")
    sub.add_parser("bench-load", add_help=False,
                   help="load memory (peak, after) vs the file size and batch-1 decode vs the roofline, for big "
                        "files; see `bench-load --help`")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench-spec"]:
        from .bench.speculative import main as bench_spec_main

        return _guarded(lambda: bench_spec_main(argv[1:]))
    if argv[:1] == ["soak"]:
        from .bench.soak import main as soak_main

        return _guarded(lambda: soak_main(argv[1:]))
    if argv[:1] == ["bench-load"]:
        from .bench.load import main as bench_load_main

        return _guarded(lambda: bench_load_main(argv[1:]))
    args = build_parser().parse_args(argv)
    commands = {"generate": run_generate, "serve": _run_serve, "bench": _run_bench, "batch": _run_batch}
    return _guarded(lambda: commands[args.command](args))


def _run_serve(args: argparse.Namespace) -> int:
    from .server.main import run_serve

    if args.model is not None:  # None: the embedded default model
        check_model_path(args.model)
    return run_serve(args)


def _run_batch(args: argparse.Namespace) -> int:
    from .batch.cli_run import run_batch

    return run_batch(args, sampler_from_args(args))


def _run_bench(args: argparse.Namespace) -> int:
    from .bench.serving import run_bench

    return run_bench(args)


def _guarded(command) -> int:
    """Run a command; user errors become one stderr line and exit status 1."""
    try:
        return command()
    except (CLIError, *USER_ERRORS) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# ---- generate ---------------------------------------------------------------------------------------
def sampler_from_args(args: argparse.Namespace):
    """SamplerSettings from the flags, validated before any model is loaded (fail fast on typos)."""
    from .contract import SamplerSettings

    given = {field: getattr(args, flag) for flag, field in SAMPLER_FLAGS.items() if getattr(args, flag) is not None}
    if args.greedy:
        if given:
            flags = ", ".join("--" + f.replace("_", "-") for f in SAMPLER_FLAGS if getattr(args, f) is not None)
            raise CLIError(f"--greedy cannot be combined with {flags}")
        return SamplerSettings.greedy()
    settings = SamplerSettings(**given)
    try:
        settings.validate()
    except ValueError as e:
        raise CLIError(f"invalid sampler setting: {e}") from None
    return settings


def run_generate(args: argparse.Namespace) -> int:
    from .cache.paged_cache import PagedCache
    from .generator.generator import DynamicGenerator
    from .generator.job import DynamicJob
    from .model.chat_format import check_chat_format
    from .model.model_and_tokenizer import load_model_and_tokenizer

    if args.system is not None and args.chat is None:
        raise CLIError("--system needs --chat (a raw --prompt has no system role)")
    settings = sampler_from_args(args)
    if args.model is not None:
        check_model_path(args.model)
    check_chat_format(args.chat_template)
    model, tokenizer = load_model_and_tokenizer(args.model, weights=args.weights)
    if args.chat is not None:
        chat_format = tokenizer.set_chat_format(args.chat_template)
        print(f"prompt format: {chat_format.label}", file=sys.stderr)
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
        messages.append({"role": "user", "content": args.chat})
        ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True),
                               encode_special_tokens=True)
        stops = sorted(tokenizer.stop_token_ids)
    else:
        if not args.prompt:
            raise CLIError("--prompt is empty")
        ids = tokenizer.encode(args.prompt, add_bos=tokenizer.add_bos)
        stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    total = ids.shape[1] + args.max_new_tokens
    limit = model.config.max_seq_len
    if total > limit:
        raise CLIError(f"prompt ({ids.shape[1]} tokens) + --max-new-tokens ({args.max_new_tokens}) = {total} "
                       f"exceeds the model's context of {limit} tokens")
    page_size = DEFAULT_PAGE_SIZE
    cache = PagedCache(model, max_tokens=-(-total // page_size) * page_size, page_size=page_size)
    gen = DynamicGenerator(model, cache, tokenizer)
    job = DynamicJob(ids, args.max_new_tokens, gen_settings=settings, seed=args.seed, stop_conditions=stops)
    t0 = time.perf_counter()
    gen.enqueue(job)
    final, t_first = None, None
    try:
        while final is None:
            for r in gen.iterate():
                if r["stage"] != "streaming":
                    continue
                if t_first is None:
                    t_first = time.perf_counter()
                if not args.json and r["text"]:
                    sys.stdout.write(r["text"])
                    sys.stdout.flush()
                if r["eos"]:
                    final = r
    finally:
        if final is None and gen.num_remaining_jobs():
            gen.cancel(job)
    t_end = time.perf_counter()
    report = _generate_report(final, t0, t_first, t_end)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(f"[{report['new_tokens']} tokens, {report['eos_reason']}, {report['tokens_per_s']:.1f} tok/s, "
              f"TTFT {report['ttft_ms']:.0f} ms, prompt {report['prompt_tokens']} tokens]", file=sys.stderr)
    return 0


def _generate_report(final: dict, t0: float, t_first: float, t_end: float) -> dict:
    """Decode speed counts the tokens after the first one over the time after it (prefill excluded)."""
    n = final["new_tokens"]
    decode_s = t_end - t_first
    return {
        "text": final["full_completion"],
        "new_tokens": n,
        "prompt_tokens": final["prompt_tokens"],
        "eos_reason": final["eos_reason"],
        "tokens_per_s": (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
        "ttft_ms": (t_first - t0) * 1000.0,
    }

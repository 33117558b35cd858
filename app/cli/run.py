"""`pagedeck run MODEL [PROMPT]`: chat with a model in the terminal, the engine running in this process.

MODEL is a path (.gguf file or HF folder), a name as `pagedeck ls` shows it (or a unique part of one), or
`default` (the embedded SmolLM2-135M-Instruct). With a PROMPT, or text on stdin, it answers once and exits
(stdin is appended to the prompt, as `ollama run` does); otherwise it is an interactive chat: tokens are
streamed, the input line keeps its history across sessions (arrow keys; prompt_toolkit), and `/` commands
change settings (app.cli.slash). A thinking model's reasoning is folded into one line (its seconds counting
while it thinks) unless --think.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from app.cli import models
from app.cli.errors import CLIError
from app.core.formatting import ENDINGS

DIM, RESET = "\x1b[2m", "\x1b[0m"


def add_parser(parser, name: str) -> None:
    parser.add_argument("model", metavar="MODEL", help="a path, a name from `pagedeck ls`, or `default`")
    parser.add_argument("prompt", nargs="*", help="answer this once and exit (stdin is added to it)")
    parser.add_argument("--system", metavar="TEXT", help="system prompt")
    parser.add_argument("--greedy", action="store_true", help="always the likeliest token (temperature 0)")
    parser.add_argument("--temperature", type=float, metavar="T")
    parser.add_argument("--seed", type=int, metavar="S", help="makes sampling reproducible")
    parser.add_argument("--max-tokens", type=int, default=None, metavar="N",
                        help="longest reply (default: until the context is full)")
    parser.add_argument("--ctx", type=int, default=4096, metavar="TOKENS", help="context (KV cache) size")
    parser.add_argument("--think", action="store_true", help="show a thinking model's reasoning (default: folded)")
    parser.add_argument("--allow-loops", action="store_true",
                        help="let a reply that repeats one sentence go on (default: stopped at the 4th copy)")
    parser.add_argument("--verbose", action="store_true", help="after each reply: its token counts and speed")
    parser.add_argument("--weights", default="auto", help="weight format (as `python -m engine serve --weights`)")
    parser.add_argument("--data-dir", type=Path, default=None, help="the app's data folder (default: the user's)")


def model_path(name: str, data_dir: Path | None) -> Path | None:
    """MODEL as a path for the engine; None for `default` (the embedded model)."""
    if name == models.DEFAULT:
        return None
    if Path(name).expanduser().exists():
        return Path(name).expanduser()
    try:
        return Path(models.resolve(name, models.find(data_dir)).path)
    except LookupError as e:
        raise CLIError(str(e)) from None


def run(args) -> int:
    from app.cli.chat_session import ChatSession, Options
    from engine.contract import SamplerSettings

    if args.max_tokens is not None and args.max_tokens < 1:
        raise CLIError("--max-tokens must be at least 1 (leave it out: until the context is full)")
    sampler = SamplerSettings.greedy() if args.greedy else SamplerSettings()
    if args.temperature is not None:
        sampler.temperature = args.temperature
    options = Options(sampler=sampler, seed=args.seed, max_tokens=args.max_tokens, system=args.system,
                      show_thinking=args.think, verbose=args.verbose, stop_on_loops=not args.allow_loops)
    path = model_path(args.model, args.data_dir)
    prompt = " ".join(args.prompt)
    if not sys.stdin.isatty():
        piped = sys.stdin.read()
        prompt = f"{prompt}\n\n{piped}" if prompt and piped.strip() else prompt or piped
    try:
        session = ChatSession(path, ctx=args.ctx, weights=args.weights, options=options)
    except (OSError, ValueError, NotImplementedError, MemoryError) as e:
        why = str(e)  # the engine's errors mostly name the file already
        named = f"the model: {why}" if str(path) in why else f"{args.model}: {why}"
        raise CLIError(f"could not load {named}") from None
    if prompt.strip() or not sys.stdin.isatty():
        if not prompt.strip():
            raise CLIError("the prompt is empty")
        return 0 if stream_reply(session, prompt.strip(), interactive=False) else 1
    return chat_loop(session, args.data_dir)


def stream_reply(session, text: str, interactive: bool) -> bool:
    """Print the reply to `text` as it comes. Reasoning: shown dimmed with --think / `/set think`, else folded
    into a "Thought for …" line (interactive) or left out (one-shot). False when the message did not fit."""
    out = sys.stdout
    show = session.options.show_thinking
    thinking = False
    shown_at = 0.0  # when the folded "Thinking…" line last showed its seconds
    stream = session.send(text)
    try:
        for reasoning, content in stream:
            if reasoning:
                if not thinking:
                    thinking = True
                    if show or interactive:
                        out.write(DIM + ("" if show else "Thinking…"))
                if show:
                    out.write(reasoning)
                elif interactive and time.perf_counter() - shown_at >= 0.5:  # a long thought shows it goes on
                    shown_at = time.perf_counter()
                    out.write(f"\r\x1b[2K{DIM}Thinking… {session_seconds(session)}")
            if content:
                if thinking:
                    thinking = False
                    if show:
                        out.write(RESET + "\n\n")
                    elif interactive:
                        out.write(f"\r\x1b[2KThought for {session_seconds(session)} (/think shows it){RESET}\n")
                out.write(content)
            out.flush()
    except ValueError as e:
        print(f"pagedeck: {e}", file=sys.stderr)
        return False
    except KeyboardInterrupt:  # the reply is cut where it was (the job cancelled); the chat goes on
        stream.close()
        out.write(RESET + "\n^C")
    if thinking:
        out.write(RESET)
    out.write("\n")
    out.flush()
    last = session.last
    if last is not None and last.eos_reason == "max_new_tokens":  # cut, not finished: say where and why
        limit = session.options.max_tokens
        why = (f"the reply limit ({limit} tokens; /set max_tokens none lifts it)"
               if limit is not None and last.new_tokens >= limit else
               f"the end of the context ({session.ctx} tokens; /clear or a larger --ctx makes room)")
        print(f"{DIM}[cut at {why}]{RESET}", file=sys.stderr, flush=True)
    elif last is not None and last.eos_reason == "repetition":  # in the app's stats line's words
        print(f"{DIM}[{ENDINGS['repetition']}; /set loops lets it run]{RESET}", file=sys.stderr, flush=True)
    if session.options.verbose and last is not None:
        rate = last.new_tokens / last.seconds if last.seconds > 0 else 0.0
        print(f"{DIM}[prompt {last.prompt_tokens} tokens, reply {last.new_tokens} tokens, {rate:.1f} tok/s, "
              f"{last.eos_reason}]{RESET}", file=sys.stderr, flush=True)
    return True


def session_seconds(session) -> str:
    return f"{time.perf_counter() - session.turn_started:.1f}s"


def chat_loop(session, data_dir: Path | None) -> int:
    """The interactive chat: read a line (history on the arrow keys), answer it or run its / command."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory

    from app.cli import slash
    from app.core.store import default_data_dir

    folder = Path(data_dir or default_data_dir())
    folder.mkdir(parents=True, exist_ok=True)
    reader = PromptSession(history=FileHistory(str(folder / "cli_history")))
    print(f"{session.chat_format.label}; /? for help, /bye to leave", file=sys.stderr)
    while True:
        try:
            line = reader.prompt(">>> ")
        except KeyboardInterrupt:
            continue
        except EOFError:
            return 0
        if not line.strip():
            continue
        if line.lstrip().startswith("/"):
            if slash.command(session, line.strip()) is slash.BYE:
                return 0
            continue
        stream_reply(session, line, interactive=True)

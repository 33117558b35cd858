"""The `/` commands of `pagedeck run`'s chat, named as in `ollama run`: /help, /set, /show, /think,
/clear, /bye."""
from __future__ import annotations

import shlex

BYE = object()  # what command() returns for /bye

HELP = """Available Commands:
  /set temperature T   sampling temperature (also top_k, top_p, min_p, repeat_penalty, seed)
  /set max_tokens N    longest reply (none: until the context is full)
  /set system TEXT     system prompt (empty to clear)
  /set think|nothink   show or fold a thinking model's reasoning
  /set loops|noloops   let a reply that repeats itself run, or stop it (the default)
  /set verbose|quiet   show or hide each reply's token counts and speed
  /show                the current settings
  /think               the last reply's folded reasoning
  /clear               forget the conversation
  /bye                 leave (also Ctrl-D)
  /?, /help            this help"""


def command(session, line: str):
    """Run one / command line; prints what it did. Returns BYE for /bye, else None."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    name, rest = words[0].lower(), words[1:]
    if name in ("/bye", "/exit", "/quit"):
        return BYE
    if name in ("/?", "/help"):
        print(HELP)
    elif name == "/clear":
        session.clear()
        print("Cleared the conversation.")
    elif name == "/set":
        if not rest:
            print("usage: /set NAME VALUE (/help lists the names)")
            return None
        try:
            print(session.set_option(rest[0].lower(), " ".join(rest[1:])))
        except (ValueError, TypeError) as e:
            print(f"error: {e}")
    elif name == "/show":
        o, s = session.options, session.options.sampler
        print(f"temperature {s.temperature}, top_k {s.top_k}, top_p {s.top_p}, min_p {s.min_p}, "
              f"repeat_penalty {s.token_repetition_penalty}, seed {o.seed}, "
              f"max_tokens {o.max_tokens or 'none (until the context is full)'}, "
              f"context {session.ctx} tokens, thinking {'shown' if o.show_thinking else 'folded'}, "
              f"repeating replies {'stopped' if o.stop_on_loops else 'let run'}\n"
              f"system: {o.system or '(none)'}\nprompt format: {session.chat_format.label}")
    elif name == "/think":
        last = session.last
        print(last.reasoning if last is not None and last.reasoning else "The last reply had no reasoning.")
    else:
        print(f"Unknown command {name!r}; /help lists them.")
    return None

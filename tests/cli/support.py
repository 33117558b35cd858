"""Running `pagedeck COMMAND` as a real process, with a private home, data folder and Hub cache."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cli_env(tmp: Path, own_home: bool = True, **extra: str) -> dict:
    """The app's data folder (XDG_DATA_HOME) and the Hub cache under tmp, HOME too unless own_home is False
    (the built CPU kernels are cached under the real one: a fresh home would compile them again)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "OLLAMA", "XDG_DATA"))}
    if own_home:
        env.update(HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "cache"))
    env.update(XDG_DATA_HOME=str(tmp / "data"), HF_HUB_CACHE=str(tmp / "hub"), PROMPT_TOOLKIT_NO_CPR="1",
               TERM="xterm", **extra)
    return env


def pagedeck(args: list[str], env: dict, stdin: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run `pagedeck ARGS`; stdin is `stdin`, else empty (never the test runner's own)."""
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=REPO, env=env, input=stdin or "", text=True,
                          capture_output=True, timeout=timeout)


def data_dir(env: dict) -> Path:
    return Path(env["XDG_DATA_HOME"]) / "pagedeck"


def ask(child, line: str, keys: str | None = None) -> str:
    """Send a line (or raw keys ending in Enter) and return what was printed until the next prompt. prompt_toolkit
    turns bracketed paste off when a line is accepted and on when the next prompt starts: between the two is the
    reply, whatever the screen redraws around the input line."""
    if keys is None:
        child.sendline(line)
    else:
        child.send(keys)
    child.expect(r"\x1b\[\?2004l")
    child.expect(r"\x1b\[\?2004h")
    return child.before

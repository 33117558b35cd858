"""Running `pagedeck COMMAND` as a real process, with a private home, data folder and Hub cache."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cli_env(tmp: Path, **extra: str) -> dict:
    """HOME, the app's data folder (XDG_DATA_HOME) and the Hub cache under tmp: nothing of the user's is read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "OLLAMA", "XDG_"))}
    env.update(HOME=str(tmp / "home"), XDG_DATA_HOME=str(tmp / "data"), XDG_CACHE_HOME=str(tmp / "cache"),
               HF_HUB_CACHE=str(tmp / "hub"), PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm", **extra)
    return env


def pagedeck(args: list[str], env: dict, stdin: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=REPO, env=env, input=stdin, text=True,
                          capture_output=True, timeout=timeout)


def data_dir(env: dict) -> Path:
    return Path(env["XDG_DATA_HOME"]) / "pagedeck"

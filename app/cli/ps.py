"""`pagedeck ps`: what a running pagedeck holds: the desktop app (its data folder's status file,
app.core.running_app) and a server (its OpenAI-compatible /v1/models and Prometheus /metrics).

With no --url it looks for both: the app of the data folder (platformdirs' user data dir, or --data-dir),
then a server at `pagedeck serve`'s default address (unless that is the app's own API, shown already).
With --url it asks that server only. Nothing found is an error naming where it looked."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from app.cli.errors import CLIError

DEFAULT_URL = "http://127.0.0.1:8399"


def add_parser(parser, name: str) -> None:
    parser.add_argument("--url", default=None,
                        help=f"a server's address: show that server only (default: the app, and {DEFAULT_URL}, "
                             "`pagedeck serve`'s)")
    parser.add_argument("--data-dir", type=Path, default=None, help="the app's data folder (default: the user's)")
    parser.add_argument("--json", action="store_true", help="one JSON object, for scripts")


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read()
    except (urllib.error.URLError, OSError) as e:
        raise CLIError(f"no server answers at {url}: {getattr(e, 'reason', e)}") from None


def metrics(text: str) -> dict[str, float]:
    """The vllm:* and pagedeck:* samples of a Prometheus text page, by name: counts summed over models,
    fractions (*_perc) the largest (the fullest model's cache)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("vllm:", "pagedeck:")) and " " in line:
            name, _, value = line.rpartition(" ")
            key = name.split("{")[0]
            try:
                v = float(value)
            except ValueError:
                continue
            out[key] = max(out.get(key, v), v) if key.endswith("_perc") else out.get(key, 0.0) + v
    return out


SHOWN = (("requests running", "vllm:num_requests_running", 1), ("requests waiting", "vllm:num_requests_waiting", 1),
         ("KV cache in use (%)", "vllm:kv_cache_usage_perc", 100))


def server_status(base: str) -> dict:
    served = json.loads(_get(base + "/v1/models")).get("data", [])
    return {"url": base, "models": served, "metrics": metrics(_get(base + "/metrics").decode("utf-8", "replace"))}


def run(args) -> int:
    from app.core.running_app import read_running, status_path

    app = server = None
    if args.url is not None:
        server = server_status(args.url.rstrip("/"))
    else:
        app = read_running(args.data_dir)
        own = (app or {}).get("server") or {}
        if own.get("url", "").rstrip("/") != DEFAULT_URL:
            try:
                server = server_status(DEFAULT_URL)
            except CLIError:
                if app is None:
                    raise CLIError(f"no pagedeck app is running with the data folder "
                                   f"{status_path(args.data_dir).parent} and no server answers at {DEFAULT_URL}"
                                   ) from None
    if args.json:
        out = {"app": app} if app is not None else {}
        if server is not None:
            out.update(models=server["models"], metrics=server["metrics"], url=server["url"])
        print(json.dumps(out, indent=1))
        return 0
    from rich.console import Console

    console = Console()
    if app is not None:
        show_app(console, app)
    if server is not None:
        if app is not None:
            console.print()
        show_server(console, server)
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def show_app(console, app: dict) -> None:
    from rich.table import Table

    api = app.get("server")
    where = f", serving {api['url']}/v1" if api else ""
    console.print(f"pagedeck app (pid {app['pid']}{where})" + (" · loading a model" if app.get("loading") else ""),
                  highlight=False)
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("NAME", "MEMORY", "PAGES", "CHATS", "REQUESTS"):
        table.add_column(column)
    for m in app["models"]:
        name = m["name"] + (" (main)" if m["main"] else "") + (" [pinned]" if m.get("pinned") and not m["main"] else "")
        table.add_row(name, _mib(m["memory_bytes"]), f"{m['pages_used']}/{m['pages_total']}",
                      str(m["chats_running"]), str(m["requests_running"]))
    if app["models"]:
        console.print(table)
    else:
        console.print("no model loaded", highlight=False)
    console.print(f"chats running: {app['chats_running']} · requests running: {app['requests_running']}",
                  highlight=False)


def show_server(console, server: dict) -> None:
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("NAME")
    table.add_column("STATUS")
    table.add_column("MEMORY")
    table.add_column("OWNED BY")
    for m in server["models"]:
        status = m.get("status", "loaded") + (" (pinned)" if m.get("pinned") else "")
        memory = _mib(m["memory_bytes"]) if isinstance(m.get("memory_bytes"), int) else ""
        table.add_row(str(m.get("id")), status, memory, str(m.get("owned_by", "")))
    console.print(f"server at {server['url']}", highlight=False)
    console.print(table)
    numbers = server["metrics"]
    for label, name, scale in SHOWN:
        if name in numbers:
            console.print(f"{label}: {numbers[name] * scale:g}", highlight=False)

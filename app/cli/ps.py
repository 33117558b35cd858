"""`pagedeck ps`: what a running pagedeck server holds, from its OpenAI-compatible /v1/models and its
Prometheus /metrics (the loaded model, requests running and waiting, cache pages in use)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from app.cli.errors import CLIError


def add_parser(parser, name: str) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8399",
                        help="the server's address (default http://127.0.0.1:8399, `pagedeck serve`'s)")
    parser.add_argument("--json", action="store_true", help="one JSON object, for scripts")


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read()
    except (urllib.error.URLError, OSError) as e:
        raise CLIError(f"no server answers at {url}: {getattr(e, 'reason', e)}") from None


def metrics(text: str) -> dict[str, float]:
    """The vllm:* and pagedeck:* samples of a Prometheus text page, by name (labels dropped: one model)."""
    out = {}
    for line in text.splitlines():
        if line.startswith(("vllm:", "pagedeck:")) and " " in line:
            name, _, value = line.rpartition(" ")
            try:
                out[name.split("{")[0]] = float(value)
            except ValueError:
                pass
    return out


SHOWN = (("requests running", "vllm:num_requests_running", 1), ("requests waiting", "vllm:num_requests_waiting", 1),
         ("KV cache in use (%)", "vllm:kv_cache_usage_perc", 100))


def run(args) -> int:
    base = args.url.rstrip("/")
    served = json.loads(_get(base + "/v1/models")).get("data", [])
    numbers = metrics(_get(base + "/metrics").decode("utf-8", "replace"))
    if args.json:
        print(json.dumps({"models": served, "metrics": numbers}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("NAME")
    table.add_column("OWNED BY")
    for m in served:
        table.add_row(str(m.get("id")), str(m.get("owned_by", "")))
    console = Console()
    console.print(table)
    for label, name, scale in SHOWN:
        if name in numbers:
            console.print(f"{label}: {numbers[name] * scale:g}", highlight=False)
    return 0

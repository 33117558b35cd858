"""How long a model stays loaded once idle: the `--ttl` default and a request's `ttl` / `keep_alive` fields.

Two clients' words for one thing, both read as "unload this model after it has been idle this long":
LM Studio's `ttl` is seconds (a number >= 0); Ollama's `keep_alive` is seconds as a number or a Go
duration ("10m", "1h30m", "250ms"), where 0 unloads the model as soon as its last request ends and a
negative value keeps it loaded until evicted or the server stops. Each request's value replaces the
model's (as Ollama does), so the last client to ask decides. None everywhere means "never idle out".
"""
from __future__ import annotations

import math
import re
from typing import Any

from .errors import bad_request

LIFETIME_FIELDS = ("ttl", "keep_alive")
FOREVER = None  # never unloaded for idleness

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_PART = re.compile(rf"({_NUMBER})(ns|us|µs|ms|s|m|h)")
# What keep_alive may be as a string: a plain number or a Go duration (the OpenAPI description uses it too).
DURATION_PATTERN = rf"^[+-]?(?:{_NUMBER}|(?:{_NUMBER}(?:ns|us|µs|ms|s|m|h))+)$"
_DURATION = re.compile(DURATION_PATTERN.removesuffix("$"))


def parse_duration(text: str) -> float:
    """Seconds of a Go duration ("5m", "1h30m", "-1s") or of a plain number ("0", "300"); ValueError if neither."""
    if not _DURATION.fullmatch(text):
        raise ValueError(f"not a duration: {text!r}")
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if re.fullmatch(_NUMBER, body):
        return sign * float(body)
    return sign * sum(float(m.group(1)) * _UNITS[m.group(2)] for m in _PART.finditer(body))


def request_ttl(body: dict) -> tuple[bool, float | None]:
    """(given, seconds) of a request's ttl / keep_alive; seconds None = keep loaded. 400 if malformed or both."""
    given = [f for f in LIFETIME_FIELDS if body.get(f) is not None]
    if not given:
        return False, None
    if len(given) > 1:
        raise bad_request("give ttl (seconds) or keep_alive (a duration), not both", "keep_alive")
    field = given[0]
    value: Any = body[field]
    if field == "ttl":
        seconds = _finite(value)
        if seconds is None or seconds < 0:
            raise bad_request(f"ttl must be a number of seconds >= 0, got {value!r}", "ttl")
        return True, seconds
    try:
        seconds = parse_duration(value) if isinstance(value, str) else _finite(value)
        if seconds is None:
            raise ValueError(value)
    except ValueError:
        raise bad_request(f"keep_alive must be seconds or a duration like '5m', got {value!r}", "keep_alive") from None
    if not math.isfinite(seconds):
        raise bad_request(f"keep_alive must be finite, got {value!r}", "keep_alive")
    return True, FOREVER if seconds < 0 else seconds


def _finite(value: Any) -> float | None:
    """A JSON number as a finite float, else None (a bool, a string, an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def parse_size(text: str) -> int:
    """Bytes of "8G", "512MiB", "1.5GB", "1000000" (K/M/G/T are powers of 1024, as memory is counted)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 8G, 512M, 1000000)")
    scale = 1024 ** " KMGT".index(m.group(2).upper() or " ")
    return int(float(m.group(1)) * scale)

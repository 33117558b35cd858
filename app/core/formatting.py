"""How the app writes numbers and reply stats as text: one formatter for each, shared by every view (chat
panes, the dashboard, the model panel, Markdown export)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.core.store import ReplyStats


def human_bytes(n: float) -> str:
    """Bytes in binary units: "512 B", "1.5 KiB", ... up to GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def human_count(n: float) -> str:
    """1234 -> "1.2 k", 135e6 -> "135.0 M", 7e9 -> "7.0 B" (billions: parameters and token counts alike)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f}"


NO_LORA = "no LoRA"  # a reply or chat that runs on the model alone

# How a finished reply's state reads when it ended for a reason the user should know about.
ENDINGS = {"repetition": "stopped: repeating itself"}


def stats_text(stats: ReplyStats | None) -> str:
    """A reply's stats on one line: state (with prefill %, or why it ended: ENDINGS), prompt/cached/new
    tokens, TTFT, tokens/s, error."""
    if stats is None:
        return ""
    state = f"prefill {stats.progress * 100:.0f}%" if stats.state == "prefill" else stats.state
    if stats.state == "done":
        state = ENDINGS.get(stats.eos_reason, state)
    parts = [state]
    if stats.prompt_tokens is not None:
        parts.append(f"prompt {stats.prompt_tokens} tok")
    if stats.cached_tokens is not None:
        parts.append(f"cached {stats.cached_tokens} tok")
    if stats.new_tokens:
        parts.append(f"{stats.new_tokens} new tok")
    if stats.ttft_s is not None:
        parts.append(f"TTFT {stats.ttft_s * 1000:.0f} ms")
    if stats.tokens_per_s is not None:
        parts.append(f"{stats.tokens_per_s:.1f} tok/s")
    pairs = stats.adapter_pairs()
    if pairs is not None:
        parts.append(adapters_text(pairs))
    if stats.error:
        parts.append(f"error: {stats.error}")
    return " · ".join(parts)


def adapters_text(pairs: list[tuple[str, float]]) -> str:
    """A LoRA set as the app shows it: "LoRA ada×1, bob×0.5", or "no LoRA" for none (the model as loaded;
    "base model" would read as the model's kind, as opposed to an instruct model)."""
    return "LoRA " + ", ".join(f"{name}×{scale:g}" for name, scale in pairs) if pairs else NO_LORA

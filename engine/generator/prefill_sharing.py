"""Prefill sharing: a queued job whose prompt a running job is still prefilling waits for that prefill.

The page table shares pages by content, but only pages whose K/V is written count as cached: N jobs on one
prompt admitted in the same step would each compute the whole prompt (into shared pages, N times the
work). Holding the followers back until the leader's prompt is written lets them find it in the cache (full
pages shared, the partial last page copied), so they feed only their last prompt token and then decode in
the same steps as the leader: the prompt is prefilled once, whatever N is.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from .job import DynamicJob


def follows_prefill(job: "DynamicJob", active: Iterable["DynamicJob"], page_size: int) -> bool:
    """Whether a running job is prefilling the prompt this one starts with and hasn't written it yet.

    Only a shared part worth a step's wait counts: a whole page, or the whole prompt but its last token
    (a few common chat-template tokens are not). CFG pairs and jobs under another adapter set never wait."""
    tokens = job.seq.tokens[: job.seq.prompt_len]
    want = min(page_size, len(tokens) - 1)
    if job.cfg or want < 1:
        return False
    for other in active:
        if not other.prefilling or other.cfg or other.lora_root != job.lora_root:
            continue
        seq = other.seq
        n = common_prefix(tokens, seq.tokens[: seq.prompt_len])
        if n >= want and n > seq.kv_len:
            return True
    return False


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

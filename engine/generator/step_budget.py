"""How many prompt tokens a step may prefill: a budget in time, not tokens.

A prefill chunk rides in the same forward as every other chat's decode token, so a big chunk stalls them
all (a 256-token chunk made a CPU step ~1 s, measured). While others decode, the step budget keeps a step
within `slowdown` x a decode-only step, i.e. the others keep >= 1/slowdown of their decode rate. The costs
come from the steps themselves (this device, this model, this batch): an exponential average of the
decode-only step time and of the extra seconds each prefill token adds. Alone (nobody decoding), prefill
takes the whole token budget: then throughput is all that matters.
"""
from __future__ import annotations


class StepBudget:
    """Decides each step's prefill token budget; fed with every step's measured time."""

    def __init__(self, max_tokens: int, slowdown: float = 2.0, min_tokens: int = 1, first_tokens: int = 16,
                 smoothing: float = 0.25):
        if max_tokens < 1 or min_tokens < 1 or not 1 <= first_tokens:
            raise ValueError("token budgets must be positive")
        if slowdown <= 1.0:
            raise ValueError(f"slowdown must be > 1 (a step may take that many decode steps' time), got {slowdown}")
        self.max_tokens = max_tokens
        self.slowdown = slowdown
        self.min_tokens = min(min_tokens, max_tokens)
        self.first_tokens = min(first_tokens, max_tokens)  # before anything is measured
        self.smoothing = smoothing
        self.decode_s: float | None = None  # a decode-only step
        self.token_s: float | None = None  # the time one prefill token adds to a step

    def tokens(self, decoding: int) -> int:
        """Prefill tokens for the next step, given how many sequences decode in it."""
        if decoding == 0:
            return self.max_tokens
        if self.decode_s is None or self.token_s is None:
            return self.first_tokens
        spare = (self.slowdown - 1.0) * self.decode_s
        return max(self.min_tokens, min(self.max_tokens, int(spare / self.token_s)))

    def record(self, prefill_tokens: int, decoding: int, seconds: float) -> None:
        """One finished step: its prefill tokens, sequences decoding, and wall time."""
        if prefill_tokens == 0:
            if decoding:
                self.decode_s = self._average(self.decode_s, seconds)
            return
        base = self.decode_s if decoding and self.decode_s is not None else 0.0
        self.token_s = self._average(self.token_s, max(seconds - base, 0.0) / prefill_tokens)

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

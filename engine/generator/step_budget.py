"""How many prompt tokens a step may prefill: a budget in time, not tokens.

A prefill chunk rides in the same forward as every other chat's decode token, so a big chunk stalls them
all (a 256-token chunk made a CPU step ~1 s, measured). While others decode, prefill is paid for in time:
every step they decode in earns (slowdown - 1) x a decode-only step of credit, and a step that prefills
spends what its prefill added to it (measured). Over any stretch the others' steps then take ~slowdown x a
decode-only step on average, i.e. they keep ~1/slowdown of their decode rate.

Credit is saved until it buys a chunk of at least `min_tokens`: a step that prefills anything also pays a
fixed cost (on the CPU it leaves the fused all-layers decode call), so a budget spent every step bought 1-6
tokens a step, each paying that cost: the others kept 25 % and a 2000-token paste took 182 s (measured
before this rule). Saving is capped at `save_steps` steps' credit, so a paste arriving after a long quiet
stretch can't stall the others for long. The costs come from the steps themselves (this device, this model,
this batch): an exponential average of the decode-only step time and of the extra seconds per prefill token.
Alone (nobody decoding), prefill takes the whole token budget: then throughput is all that matters.
"""
from __future__ import annotations


class StepBudget:
    """Decides each step's prefill token budget; fed with every step's measured time."""

    def __init__(self, max_tokens: int, slowdown: float = 2.0, min_tokens: int = 64, first_tokens: int = 16,
                 smoothing: float = 0.25, save_steps: int = 16):
        if max_tokens < 1 or min_tokens < 1 or not 1 <= first_tokens or save_steps < 1:
            raise ValueError("token budgets and save_steps must be positive")
        if slowdown <= 1.0:
            raise ValueError(f"slowdown must be > 1 (a step may take that many decode steps' time), got {slowdown}")
        self.max_tokens = max_tokens
        self.slowdown = slowdown
        self.min_tokens = min(min_tokens, max_tokens)  # the smallest chunk worth a prefill step's fixed cost
        self.first_tokens = min(first_tokens, max_tokens)  # before anything is measured
        self.smoothing = smoothing
        self.save_steps = save_steps
        self.decode_s: float | None = None  # a decode-only step
        self.token_s: float | None = None  # the time one prefill token adds to a step
        self.credit = 0.0  # seconds of prefill the decoding chats have paid for and not yet received

    def tokens(self, decoding: int) -> int:
        """Prefill tokens for the next step, given how many sequences decode in it (0: save credit)."""
        if decoding == 0:
            return self.max_tokens
        if self.decode_s is None or self.token_s is None:
            return self.first_tokens
        affordable = min(self.max_tokens, int(self.credit / self.token_s))
        if affordable >= self.min_tokens:
            return affordable
        return max(1, affordable) if self.credit >= self._cap() else 0  # saved all it may: always progress

    def record(self, prefill_tokens: int, decoding: int, seconds: float) -> None:
        """One finished step: its prefill tokens, sequences decoding, and wall time."""
        if decoding and self.decode_s is not None:
            self.credit = min(self.credit + (self.slowdown - 1.0) * self.decode_s, self._cap())
        if prefill_tokens == 0:
            if decoding:
                self.decode_s = self._average(self.decode_s, seconds)
            return
        base = self.decode_s if decoding and self.decode_s is not None else 0.0
        extra = max(seconds - base, 0.0)
        self.token_s = self._average(self.token_s, extra / prefill_tokens)
        if decoding:
            self.credit -= extra  # may go negative: the next steps repay an overrun before prefilling again

    def _cap(self) -> float:
        return self.save_steps * (self.slowdown - 1.0) * (self.decode_s or 0.0)

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

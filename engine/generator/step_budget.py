"""How many prompt tokens a step may prefill while other chats decode: a fair share in solo time.

Two goals hold over a paste (a long prompt arriving while chats decode): the decoders keep >= 1/2 of their
decode rate, and the paste's first token comes within 2x of the time its prefill takes alone. Measured:
D, a decode-only step, and p, a prompt token's cost when prefilling alone. Over a paste of N tokens that
took T seconds, in which the decoders decoded S tokens each: they kept S*D/T of their rate, and the paste
took r = T/(N*p) times its solo time.

The fair share rule: every step the decoders decode in earns the prefill `share` x D/p tokens of credit
(what a solo prefill does in one decode step's time), and a chunk spends its tokens. So N*p ~ share*S*D,
and with share = 1, kept = 1/r: both goals hold exactly when either does, i.e. when T <= 2*S*D. Among
chunk schedules with that split this is the max-min choice: a bigger share speeds the paste by exactly
what it slows the decoders (and the reverse).

Whether T <= 2*S*D is possible depends on `o`, a mixed step's time beyond its chunk's solo cost (the
decoders' rows, the step's fixed costs, a small chunk's poorer kernel efficiency): measured on the steps.
Spent every step (each step one chunk of D/p tokens), a step takes o + D, so r = 1 + o/D: both goals hold
iff o <= D, which needs the decoders' rows to share the chunk's weight pass (one forward, the same
kernel). Saved for k+1 decode steps and spent in one chunk of (k+1)*D/p tokens, a cycle takes
k*D + o + (k+1)*D, so r = 2 + (o - D)/((k+1)*D): for o > D (no sharing: the goals can't both hold) it
approaches 2 as chunks grow, and the chunk is made just big enough that r <= 2 * (1 + tolerance) (at most
max_save_steps decode steps' share, so a mixed step's pause stays bounded). The
budget tries spending every step first and saves only once that mode's measured o exceeds D.

o measured as t - c*p is inflated by small chunks: p comes from big solo chunks, and a small chunk costs more
per token (a step's fixed costs, the kernels' poorer efficiency on few rows). So once the mixed steps span
chunk sizes (a big one at least `spread` x a small one), the budget fits their cost as a line, t(c) = A + B*c
(least squares over the last `window` mixed steps), and picks the schedule from it: saving for k decode
steps and spending k x D/p tokens, a cycle takes (k-1)*D + A + B*c, so kept(k) = k*D / cycle and
r(k) = cycle / (c*p); k is the smallest with min(kept, 1/r) >= 1/(2 (1 + tolerance)), or else the one
maximizing it (bounded pauses). k = 1 is spending every step. The decoders' share is in the cycle's decode steps: a schedule that
ignored it (big chunks every step) would predict, and get, kept far below the target.
Alone (nobody decoding), prefill takes the whole token budget: then throughput is all that matters.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

EVERY, SAVE = "every step", "saved"


class StepBudget:
    """Decides each step's prefill token budget; fed with every step's measured time."""

    def __init__(self, max_tokens: int, share: float = 1.0, min_tokens: int = 8, first_tokens: int = 16,
                 smoothing: float = 0.25, tolerance: float = 0.05, max_save_steps: int = 32, window: int = 48,
                 spread: float = 1.5):
        if max_tokens < 1 or min_tokens < 1 or first_tokens < 1 or max_save_steps < 1:
            raise ValueError("token budgets and max_save_steps must be positive")
        if share <= 0 or tolerance <= 0:
            raise ValueError(f"share and tolerance must be > 0, got {share}, {tolerance}")
        self.max_tokens = max_tokens
        self.share = share
        # the smallest chunk worth a prefill step: the CPU kernels' GEMM path starts at 8 rows (32 for Q4_K)
        self.min_tokens = min(min_tokens, max_tokens)
        self.first_tokens = min(first_tokens, max_tokens)  # before anything is measured
        self.smoothing = smoothing
        self.tolerance = tolerance
        # a saved chunk is at most this many decode steps' share: one noisy step measured as a huge o can't
        # stall the decoders for seconds (a chunk's pause is ~o + steps x D)
        self.max_save_steps = max_save_steps
        self.decode_s: float | None = None  # D: a decode-only step, the median of the last 9 (one stall moves it not)
        self._decodes: deque[float] = deque(maxlen=9)
        self.token_s: float | None = None  # p: a prompt token's seconds when prefilling alone
        self.mixed_token_s: float | None = None  # (t - D) / c of mixed steps: p's stand-in until p is measured
        self.overhead_s: dict[str, float | None] = {EVERY: None, SAVE: None}  # o, per mode
        self.credit = 0.0  # prompt tokens the decoding chats' steps have earned and prefill not yet spent
        self.mode = EVERY  # then SAVE for good once 3 mixed steps measured o > D (one noisy step doesn't)
        self._step_mode = EVERY
        self._samples = {EVERY: 0, SAVE: 0}
        self._mixed: deque[tuple[int, float]] = deque(maxlen=window)  # (chunk tokens, seconds) of mixed steps
        self.spread = spread
        self.steps_fitted: int | None = None  # k from the fitted cost line, None until the chunks span sizes

    # ---- the fitted cost of a mixed step -----------------------------------------------------------------
    def cost_line(self) -> tuple[float, float] | None:
        """(A, B): a mixed step's seconds as A + B*c, least squares over the last mixed steps; None until
        their chunks span sizes (one size alone can't tell a step's fixed cost from its per-token cost)."""
        if len(self._mixed) < 4:
            return None
        cs = [c for c, _ in self._mixed]
        if max(cs) < self.spread * min(cs):
            return None
        mc = statistics.fmean(cs)
        mt = statistics.fmean(t for _, t in self._mixed)
        sxx = sum((c - mc) ** 2 for c in cs)
        b = sum((c - mc) * (t - mt) for c, t in self._mixed) / sxx
        b = max(b, 0.0)
        return max(mt - b * mc, 0.0), b

    def fitted_schedule(self, steps: int, line: tuple[float, float] | None = None) -> tuple[float, float] | None:
        """(kept, r) the cost line (the fitted one unless given) predicts when saving for `steps` decode
        steps, or None."""
        line, earn, d = line or self.cost_line(), self.earned(), self.decode_s
        p = self.token_s if self.token_s is not None else self.mixed_token_s
        if line is None or not earn or not d or not p:
            return None
        c = min(self.max_tokens, max(self.min_tokens, steps * earn))
        cycle = (steps - 1) * d + line[0] + line[1] * c
        return steps * d / cycle, cycle / (c * p)

    def _fit_steps(self) -> int | None:
        """The smallest k whose min(kept, 1/r) on the cost line meets the goals (within the tolerance where no k
        does), else the best."""
        scores = []
        for k in range(1, self.max_save_steps + 1):
            pred = self.fitted_schedule(k)
            if pred is None:
                return None
            scores.append(min(pred[0], 1.0 / pred[1]))
        # the goals themselves where some k reaches them (the measured p understates a long paste's, so no slack
        # is spent there), else within the tolerance, else the best
        enough = 0.5 if max(scores) >= 0.5 else min(max(scores), 0.5 / (1 + self.tolerance))
        return next(k for k, s in enumerate(scores, 1) if s >= enough)

    # ---- the rule ---------------------------------------------------------------------------------
    def earned(self) -> float:
        """Tokens one decode step earns the prefill: share x what a solo prefill does in a decode step."""
        p = self.token_s if self.token_s is not None else self.mixed_token_s
        return self.share * self.decode_s / p if self.decode_s is not None and p else 0.0

    def target(self) -> int:
        """The chunk the credit is saved up to before it is spent (see the module docstring)."""
        if self.mode == EVERY:
            return self.min_tokens
        if self.steps_fitted is not None:
            return max(self.min_tokens, min(self.max_tokens, math.ceil(self.steps_fitted * self.earned())))
        o = self.overhead_s[SAVE] if self.overhead_s[SAVE] is not None else self.overhead_s[EVERY]
        d = self.decode_s
        steps = max(1, math.ceil((o - d) / (2 * self.tolerance * d))) if o is not None and d else 1
        steps = min(steps, self.max_save_steps)
        return max(self.min_tokens, min(self.max_tokens, math.ceil(steps * self.earned())))

    def tokens(self, decoding: int, waiting: int | None = None) -> int:
        """Prefill tokens for the next step, given how many sequences decode in it and how many prompt tokens
        wait to be prefilled (None: unknown; a prompt's last chunk is not saved for past its end)."""
        if decoding == 0:
            return self.max_tokens
        earn = self.earned()
        if earn == 0.0:
            return self.first_tokens  # nothing measured yet: a small first chunk
        self._step_mode = self.mode
        available = self.credit + earn  # the decoders decode in this step too
        target = self.target() if waiting is None else min(self.target(), max(waiting, 1))
        return min(self.max_tokens, int(available)) if available >= target else 0

    def record(self, prefill_tokens: int, decoding: int, seconds: float) -> None:
        """One finished step: its prefill tokens, sequences decoding, and wall time."""
        if not decoding:
            if prefill_tokens:  # weighed by its tokens: a short prompt's per-token cost says little
                weight = min(1.0, prefill_tokens / 64)
                self.token_s = self._average(self.token_s, seconds / prefill_tokens, weight)
            return
        earn = self.earned()
        if prefill_tokens == 0:
            self._decodes.append(seconds)
            self.decode_s = statistics.median(self._decodes)
            self.credit = min(self.credit + earn, self._cap())
            return
        if self.decode_s is None:
            return  # the first chunk (first_tokens): nothing to compare it with yet
        self.credit = max(0.0, min(self.credit + earn - prefill_tokens, self._cap()))
        self.mixed_token_s = self._average(self.mixed_token_s, max(seconds - self.decode_s, 0.0) / prefill_tokens)
        p = self.token_s if self.token_s is not None else self.mixed_token_s
        mode = self._step_mode
        self.overhead_s[mode] = self._average(self.overhead_s[mode], max(seconds - prefill_tokens * p, 0.0))
        self._samples[mode] += 1
        self._mixed.append((prefill_tokens, seconds))
        fitted = self._fit_steps()
        if fitted is not None:  # the cost line decides, either way; kept while the window holds one size
            self.steps_fitted = fitted
            self.mode = EVERY if fitted == 1 else SAVE
        elif self.steps_fitted is None and self.mode == EVERY and self._samples[EVERY] >= 3 and self.overhead_s[EVERY] > self.decode_s:
            self.mode = SAVE  # the decoders' rows don't share the chunk's pass: amortize o over bigger chunks

    def predicted_ratio(self) -> float | None:
        """r (and 1/kept, with share = 1) the measured costs predict for the current mode, or None."""
        if self.steps_fitted is not None:
            pred = self.fitted_schedule(self.steps_fitted if self.mode == SAVE else 1)
            if pred is not None:
                return pred[1]
        o, d = self.overhead_s[self.mode], self.decode_s
        if o is None or d is None:
            return None
        if self.mode == EVERY:
            return 1.0 + o / d
        earn = self.earned()
        steps = max(1.0, self.target() / earn) if earn else 1.0
        return 2.0 + (o - d) / (steps * d)

    def explain(self) -> dict:
        """The measured cost model and why it picks its chunks: D, p, the fitted line A + B*c, whether both
        goals are reachable on it, the save length k and chunk it chose, and the kept / r it predicts.

        On the line, saving for k decode steps with a chunk of k*D/p tokens gives kept = 1/r = k*D / cycle,
        cycle = (k-1)*D + A + B*k*D/p. With B = p that is k / (2k - 1 + A/D): above 1/2 for every k iff
        A < D (the decoders' rows and the step's fixed costs fit in one decode step's time: they share the
        chunk's weight pass), best at k = 1; below 1/2 for every k iff A > D (a second pass), best as k grows.
        In general k reaches both iff p*A <= D * (p + k*(p - B)): at k = 1 iff A <= D * (2 - B/p); where B < p
        (a big chunk's tokens cheaper than the solo reference's) saving longer helps. `reachable`: some
        k <= max_save_steps does."""
        d, earn = self.decode_s, self.earned()
        p = self.token_s if self.token_s is not None else self.mixed_token_s
        line = self.cost_line()
        out: dict = {"mode": self.mode, "decode_ms": 1e3 * (d or 0.0), "token_ms": 1e3 * (p or 0.0),
                     "earned_tokens": earn, "chunk_target": self.target() if earn else 0,
                     "steps_fitted": self.steps_fitted or 0, "line_a_ms": 0.0, "line_b_ms": 0.0, "a_over_d": 0.0,
                     "b_over_p": 0.0, "reachable": False, "predicted_kept": 0.0, "predicted_r": 0.0}
        o = self.overhead_s[self.mode]
        if line is None and o is not None:
            line = (o, p)  # one chunk size seen: the line through it with B = p (A is then o, t - c*p)
        if line is None or not d or not p:
            out["why"] = "nothing measured yet"
            return out
        a, b = line
        reachable = any(p * a <= d * (p + k * (p - b)) for k in range(1, self.max_save_steps + 1))
        k = self.steps_fitted or 1
        kept, r = self.fitted_schedule(k, line) or (0.0, 0.0)
        out.update(line_a_ms=1e3 * a, line_b_ms=1e3 * b, a_over_d=a / d, b_over_p=b / p, reachable=reachable,
                   predicted_kept=kept, predicted_r=r,
                   why=(f"A = {a / d:.2f} D, B = {b / p:.2f} p: " + (
                       "the decoders ride in the chunk's pass; a chunk of one decode step's share every step"
                       if reachable and k == 1 else
                       f"both goals reachable; saved for {k} decode steps per chunk" if reachable else
                       f"unreachable (p A > D (p + k (p - B)) for every k: a second pass, or fixed costs over "
                       f"a decode step): kept = 1/r < 1/2; saved for {k} "
                       f"decode steps per chunk, the smallest within {self.tolerance:.0%} of the goals or the best")))
        return out

    def _cap(self) -> float:
        """Credit is saved up to one target chunk, no more: while nothing prefills it stops there, so a paste
        arriving after a quiet stretch starts with one chunk, never a stall."""
        return float(max(self.target(), math.ceil(self.earned())))

    def _average(self, old: float | None, new: float, weight: float = 1.0) -> float:
        return new if old is None else old + self.smoothing * weight * (new - old)

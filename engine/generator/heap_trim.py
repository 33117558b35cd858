"""HeapTrim: hand the heap's freed memory back to the OS from the engine loop, now and then.

What a long serving run leaves behind is not live objects (Python objects, tensors and pages stay flat)
but glibc's retention: every step frees activations, logits copies and sampler arrays whose sizes change
with the batch and the prompt, many below glibc's (dynamic) mmap threshold, so they come from the heap
arenas (one per thread that allocates: torch's, the sampling pool's), and freed chunks there are kept
for reuse. With varied shapes the free space fragments and each arena grows instead of reusing it:
measured on the default model, the in-use heap stayed flat while the freed-but-kept part grew ~70 MB
per 1000 requests. malloc_trim(0) releases every whole free page inside the arenas (MADV_DONTNEED), so
the resident size follows what is really in use.

A trim walks the arenas' free lists (milliseconds) on the generator's thread, so it runs when the
queue drains (at most every `idle_period` seconds) and, for a server that never drains, every
`busy_period` seconds between steps. A no-op where there is no glibc.
"""
from __future__ import annotations

import time

from ..model.heap import release_freed_memory


class HeapTrim:
    def __init__(self, idle_period: float = 2.0, busy_period: float = 15.0, clock=time.monotonic):
        self.idle_period, self.busy_period, self.clock = idle_period, busy_period, clock
        self.last = float("-inf")  # the first drain trims (e.g. a reload just freed the old model)
        self.trims = 0

    def after_step(self, idle: bool) -> bool:
        """Trim if it is time (the generator calls this after each step); True if it trimmed."""
        now = self.clock()
        if now - self.last < (self.idle_period if idle else self.busy_period):
            return False
        self.trim()
        return True

    def trim(self) -> None:
        release_freed_memory()
        self.last = self.clock()
        self.trims += 1

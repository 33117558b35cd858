"""The draw: one job's sampler (penalties, truncation, its own RNG), the step's draws from its logits rows
(plain, CFG-mixed, verifying drafts) and the per-step sampling thread pool.

Imports: engine.cache and engine.contract (independent of the model)."""

"""The draw: one job's sampler (penalties, truncation, its own RNG) and the per-step sampling thread pool."""

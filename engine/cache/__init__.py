"""The paged K/V cache: the page table (who holds which page, prefix reuse, LRU), the K/V pools it indexes,
the spec a cache is built from and the byte counts every fit check compares.

Imports: engine.contract and kernels only. A cache never sees the model: it is built from a CacheSpec,
which the model's own spec must equal."""

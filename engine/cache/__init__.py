"""The paged K/V cache: the page table (who holds which page, prefix reuse, LRU) and the K/V pools it indexes."""

"""The page table: which physical cache page holds which tokens, who uses it, and what can be reused.

Pages are named by a chained hash of their tokens (blake2b over the previous page's hash and this page's
token ids), so two sequences with the same prefix map to the same pages. The chain starts at a root
hash that carries extra identity (the job's LoRA set: adapter content and scales), so K/V computed under
one adapter set is never reused under another, and jobs with equal sets share it. Unreferenced pages keep
their K/V as a prompt cache and are recycled least recently used first, a released chain from its tail (vLLM's
order): a prefix is only of use from its first page on, so evicting a chain's first page would waste every
page after it. Pages a queued (preempted) job will resume from (`awaited`) go after every other cached page:
that job is certain to want them back, whereas a finished reply's pages only may be.

A page's name (phash) and its prev_hash label come only from its own tokens and its real predecessor's
hash: dedup and partial-page reuse trust them to mean "K/V of these tokens at these positions". The table
records only tokens that can no longer change (accepted drafts; tokens not held for a banned string), so
nothing it has named is ever rolled back.
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..contract import CACHED, FREE, check_page_size


def chain_hash(prev: bytes, tokens: list[int]) -> bytes:
    """Hash of one full page given the previous page's hash."""
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


def root_hash(identity: object = None) -> bytes:
    """The chain's start; identity (e.g. the LoRA set and scales) separates caches that must not mix."""
    return hashlib.blake2b(repr(identity).encode(), digest_size=16).digest()


@dataclass(eq=False)
class CachePage:
    index: int
    phash: bytes | None = None  # content hash; set for full pages (or prompt pages about to be filled)
    prev_hash: bytes | None = None  # hash of the page before it in its sequence
    tokens: list[int] = field(default_factory=list)  # tokens this page holds (its K/V may lag: kv_position)
    kv_position: int = 0  # slots holding valid K/V
    draft_position: int = 0  # slots of the draft model's mirrored cache holding valid K/V (<= kv_position)
    ref_count: int = 0
    owners: list[int] = field(default_factory=list)  # serials of the jobs referencing it (for the page map)
    access_serial: int = 0
    root: bytes | None = None  # the root hash its chain starts from (its adapter set), for the page map


@dataclass
class Allocation:
    """The pages of one sequence and how much of its prompt was found in the cache."""

    pages: list[CachePage]
    cached_tokens: int
    cached_pages: int
    draft_tokens: int = 0  # of the cached tokens, how many the draft model's cache holds too


class PageTable:
    def __init__(self, num_pages: int, page_size: int, copy_fn: Callable[[int, int, int], None] | None = None):
        check_page_size(page_size)
        if num_pages < 1:
            raise ValueError("the cache needs at least one page")
        self.page_size = page_size
        self.pages = [CachePage(i) for i in range(num_pages)]
        self.by_hash: dict[bytes, CachePage] = {}
        self.copy_fn = copy_fn  # copy_fn(src_page, dst_page, n_slots) copies K/V for partial-page reuse
        self._serial = itertools.count(1)
        self.awaited: set[int] = set()  # indices of cached pages a queued job will resume from (PageGrowth)

    # ---- capacity ---------------------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return len(self.pages)

    def pages_needed(self, total_len: int) -> int:
        return -(-total_len // self.page_size)

    def num_unreferenced(self) -> int:
        """Pages nobody references: free ones and cached ones (the prompt cache gives way to new K/V)."""
        return sum(1 for p in self.pages if p.ref_count == 0)

    def prompt_hashes(self, tokens: list[int], root: bytes) -> list[bytes]:
        """Chained hashes of the prompt's full pages."""
        out, prev = [], root
        for start in range(0, len(tokens) - self.page_size + 1, self.page_size):
            prev = chain_hash(prev, tokens[start : start + self.page_size])
            out.append(prev)
        return out

    def can_allocate(self, tokens: list[int], total_len: int, root: bytes) -> bool:
        return self.can_allocate_all([(tokens, total_len)], root)

    def can_allocate_all(self, wants: list[tuple[list[int], int]], root: bytes) -> bool:
        """Room for several sequences at once (a CFG pair); pages they'd share with each other count twice."""
        return self.pages_to_allocate(wants, root) <= self.num_unreferenced()

    def pages_to_allocate(self, wants: list[tuple[list[int], int]], root: bytes) -> int:
        """Unreferenced pages that allocating these (tokens, total_len) sequences would take: pages shared with
        running sequences cost nothing, pages found in the prompt cache cost one each (they stop being free)."""
        needed = 0
        for tokens, total_len in wants:
            needed += self.pages_needed(total_len) - sum(1 for h in self.prompt_hashes(tokens, root) if self._live(h))
        return needed

    def _live(self, h: bytes) -> bool:
        page = self.by_hash.get(h)
        return page is not None and page.ref_count > 0

    # ---- allocation -------------------------------------------------------------------------------
    def allocate(self, tokens: list[int], total_len: int, root: bytes, owner: int) -> Allocation:
        """Pages for a sequence whose prompt is `tokens`, enough for its first total_len tokens (grow adds
        more as it goes).

        Full prompt pages found by hash are shared (referenced) or revived (cached); the rest come from
        the free/cached pool, LRU. A partial match of the next page is copied in (partial-page reuse).
        """
        if not self.can_allocate(tokens, total_len, root):
            raise MemoryError("not enough free cache pages for this sequence")
        ps = self.page_size
        hashes = self.prompt_hashes(tokens, root)
        found: list[CachePage | None] = [self.by_hash.get(h) for h in hashes]
        # Reference every hit first so that taking LRU pages below can't evict them.
        for page in found:
            if page is not None:
                self._ref(page, owner)
        n_total = self.pages_needed(total_len)
        fresh = iter(self._take_unreferenced(n_total - sum(p is not None for p in found)))
        pages: list[CachePage] = []
        prev = root
        cached_tokens = 0
        counting = True  # cached tokens count only along an unbroken prefix of written pages
        for i in range(n_total):
            chunk = tokens[i * ps : (i + 1) * ps]
            fresh_page = not (i < len(found) and found[i] is not None)
            if not fresh_page:
                page = found[i]
            else:
                page = next(fresh)
                self._assign(page, prev, chunk, owner, root)
                if i < len(hashes):
                    page.phash = hashes[i]
                    self.by_hash.setdefault(hashes[i], page)
            if counting and page.kv_position == ps and i < len(hashes):
                cached_tokens += ps
            elif counting:
                counting = False
                if fresh_page and chunk:
                    cached_tokens += self._reuse_partial(page, prev, chunk, limit=len(tokens) - 1 - i * ps)
            pages.append(page)
            prev = hashes[i] if i < len(hashes) else None  # known once the page before it fills (_complete)
        # Never report the whole prompt as cached: its last token must run through the model for logits.
        cached_tokens = min(cached_tokens, max(len(tokens) - 1, 0))
        cached_pages = sum(1 for p in pages[: len(hashes)] if p.kv_position == ps)
        draft_tokens = 0
        for page in pages:
            draft_tokens += page.draft_position
            if page.draft_position < ps:
                break
        return Allocation(pages, cached_tokens, cached_pages, min(draft_tokens, cached_tokens))

    def _reuse_partial(self, page: CachePage, prev: bytes, chunk: list[int], limit: int) -> int:
        """Copy the longest matching prefix of `chunk` from any written page following the same prefix."""
        if self.copy_fn is None or limit <= 0:
            return 0
        best, best_n = None, 0
        for cand in self.pages:
            if cand is page or cand.prev_hash != prev or cand.kv_position == 0:
                continue
            n = 0
            for a, b in zip(cand.tokens[: cand.kv_position], chunk):
                if a != b:
                    break
                n += 1
            if n > best_n:
                best, best_n = cand, n
        best_n = min(best_n, limit)
        if best is None or best_n == 0:
            return 0
        self.copy_fn(best.index, page.index, best_n)
        page.kv_position = best_n
        page.draft_position = min(best_n, best.draft_position)
        self.touch(best)
        return best_n

    def _take_unreferenced(self, n: int) -> list[CachePage]:
        # Empty pages first, then cached ones nobody waits for, then awaited ones; least recently used first.
        awaited = self.awaited
        pool = sorted((p for p in self.pages if p.ref_count == 0),
                      key=lambda p: (p.kv_position > 0, p.index in awaited, p.access_serial))
        return pool[:n]

    def _assign(self, page: CachePage, prev: bytes | None, chunk: list[int], owner: int, root: bytes) -> None:
        self._forget(page)
        page.root = root
        page.prev_hash = prev
        page.tokens = list(chunk)
        page.kv_position = page.draft_position = 0
        self._ref(page, owner)

    def _forget(self, page: CachePage) -> None:
        if page.phash is not None and self.by_hash.get(page.phash) is page:
            del self.by_hash[page.phash]
        page.phash = None

    def _ref(self, page: CachePage, owner: int) -> None:
        page.ref_count += 1
        page.owners.append(owner)
        self.touch(page)

    def touch(self, page: CachePage) -> None:
        page.access_serial = next(self._serial)

    # ---- growth and completion --------------------------------------------------------------------
    def grow(self, pages: list[CachePage], total_len: int, root: bytes, owner: int) -> bool:
        """Append pages to a sequence's block table so that it holds total_len tokens; False (and nothing
        changes) when the pool lacks them. Pages come as allocate takes them: empty ones first, then cached
        ones, least recently used first. A sequence asks for pages as it is about to write them, so pages
        are held for what is written, not for what a reply might reach."""
        n = self.pages_needed(total_len) - len(pages)
        if n <= 0:
            return True
        fresh = self._take_unreferenced(n)
        if len(fresh) < n:
            return False
        for page in fresh:
            # The chain continues from the last page's name; if that page hasn't filled yet, _complete labels
            # the new page when it does.
            prev = pages[-1].phash if pages else root
            self._assign(page, prev, [], owner, root)
            pages.append(page)
        return True

    def written(self, pages: list[CachePage], tokens: list[int], kv_len: int, draft_len: int = 0) -> None:
        """Record that a sequence's K/V now covers tokens[:kv_len] (and the draft model's mirrored cache
        tokens[:draft_len]); full pages get hashed and deduplicated."""
        ps = self.page_size
        draft_len = min(draft_len, kv_len)
        for i in range(len(pages)):
            start = i * ps
            if start >= kv_len:
                break
            page = pages[i]
            n = min(kv_len - start, ps)
            if page.kv_position < n:
                if len(page.tokens) < n:
                    page.tokens = tokens[start : start + n]
                page.kv_position = n
            page.draft_position = max(page.draft_position, min(draft_len - start, n))
            if n == ps and page.phash is None:
                self._complete(pages, i)

    def _complete(self, pages: list[CachePage], i: int) -> None:
        """Name a page that just filled; share an existing copy of the same K/V instead of keeping two."""
        page = pages[i]
        if page.prev_hash is None:
            raise RuntimeError(f"page {page.index} filled before the page preceding it")
        h = chain_hash(page.prev_hash, page.tokens)
        if i + 1 < len(pages):
            pages[i + 1].prev_hash = h  # whichever physical page ends up holding this one
        other = self.by_hash.get(h)
        if (other is not None and other is not page and other.kv_position == self.page_size
                and other.draft_position >= page.draft_position):
            # The same K/V already exists (draft K/V too): share it and give our copy back to the free pool.
            if page.ref_count != 1:
                raise RuntimeError(f"page {page.index} filled while shared by {page.ref_count} sequences")
            owner = page.owners[0]
            self._ref(other, owner)
            pages[i] = other
            self._unref(page, owner)
            self._clear(page)
            return
        page.phash = h
        if other is None or (other.kv_position, other.draft_position) < (self.page_size, page.draft_position):
            self.by_hash[h] = page  # a written page beats one waiting for its prefill or lacking draft K/V

    # ---- release ----------------------------------------------------------------------------------
    def release(self, pages: list[CachePage], owner: int) -> None:
        """Drop one sequence's references. Written pages stay as prompt cache, last used now, its last page
        least recently and its first most (so that recycling takes the chain from its tail: what is left is
        still a prefix); unwritten ones become free."""
        for page in reversed(pages):
            self._unref(page, owner)
            if page.ref_count == 0 and page.kv_position:
                self.touch(page)

    def _unref(self, page: CachePage, owner: int) -> None:
        if page.ref_count <= 0:
            raise RuntimeError(f"page {page.index} released more often than referenced")
        page.ref_count -= 1
        page.owners.remove(owner)
        if page.ref_count == 0:
            if page.kv_position < len(page.tokens):
                self._forget(page)  # a prompt page nobody finished writing is not a valid cache entry
                del page.tokens[page.kv_position :]
            if page.kv_position == 0:
                self._clear(page)

    def _clear(self, page: CachePage) -> None:
        """An unreferenced page holds nothing worth keeping: drop its name, labels and content."""
        self._forget(page)
        page.prev_hash, page.tokens, page.kv_position, page.draft_position = None, [], 0, 0
        page.root = None

    def reset(self) -> None:
        """Forget all cached content (pages must be unreferenced)."""
        if any(p.ref_count for p in self.pages):
            raise RuntimeError("reset_page_table() while jobs hold pages")
        for p in self.pages:
            self._clear(p)
        self.awaited = set()

    # ---- defragmentation --------------------------------------------------------------------------
    def defrag_order(self) -> list[int] | None:
        """A physical order that lays cached chains out contiguously, or None if it would move <= 10%.

        Only valid while no page is referenced. Returns new_order where new_order[k] = old page index
        that should move to slot k.
        """
        if any(p.ref_count for p in self.pages):
            return None
        children: dict[bytes | None, list[CachePage]] = {}
        for p in self.pages:
            if p.kv_position:
                children.setdefault(p.prev_hash, []).append(p)
        order: list[CachePage] = []
        seen: set[int] = set()
        hashed = {p.phash for p in self.pages if p.phash is not None}
        roots = [p for p in self.pages if p.kv_position and p.prev_hash not in hashed]
        stack = sorted(roots, key=lambda p: p.access_serial, reverse=True)
        while stack:
            p = stack.pop()
            if p.index in seen:
                continue
            seen.add(p.index)
            order.append(p)
            if p.phash is not None:
                stack.extend(sorted(children.get(p.phash, []), key=lambda c: c.access_serial, reverse=True))
        order += [p for p in self.pages if p.kv_position and p.index not in seen]
        order += [p for p in self.pages if not p.kv_position]
        moved = sum(1 for k, p in enumerate(order) if p.index != k)
        if moved <= len(self.pages) // 10:
            return None
        return [p.index for p in order]

    def apply_order(self, new_order: list[int]) -> None:
        awaited = [self.pages[i] for i in self.awaited]
        self.pages = [self.pages[i] for i in new_order]
        for k, p in enumerate(self.pages):
            p.index = k
        self.awaited = {p.index for p in awaited}

    # ---- inspection -------------------------------------------------------------------------------
    def states(self) -> tuple[list[int], list[bool]]:
        """Per page: first owner serial, CACHED or FREE; and whether the page is shared."""
        states, shared = [], []
        for p in self.pages:
            owners = p.owners
            if owners:
                states.append(owners[0])
                shared.append(len(set(owners)) > 1 or p.ref_count > 1)
            else:
                states.append(CACHED if p.kv_position else FREE)
                shared.append(False)
        return states, shared

"""`TokenKV`: SGLang-style KV bookkeeping: token slots, request rows, radix prefix cache."""

from __future__ import annotations

import numpy as np

from runtime.scheduler.radix_cache import RadixCache
from runtime.scheduler.req import Req
from runtime.scheduler.row_pool import RowPool
from runtime.scheduler.token_pool import TokenAllocator


class TokenKV:
    """Owns every KV slot and row; requests borrow them through admit/alloc/release.

    A slot is in exactly one place: the allocator's free list, the radix tree
    (evictable or locked by a request's prefix), or a live request's own `slots`
    beyond its `cached_len`.
    """

    page_size = 1

    def __init__(self, num_slots: int, num_rows: int) -> None:
        self.allocator = TokenAllocator(num_slots)
        self.rows = RowPool(num_rows)
        self.cache = RadixCache(self.allocator)

    # ------------------------------------------------------------------ capacity
    @property
    def total(self) -> int:
        return self.allocator.total

    def available(self) -> int:
        """Slots obtainable now: free plus evictable cached."""
        return self.allocator.available + self.cache.evictable_size

    def used(self) -> int:
        """Slots holding KV for running requests (their own and the prefixes they lock)."""
        return self.allocator.total - self.available()

    def slots_needed(self, req: Req, n: int) -> int:
        return n

    def decode_need(self, reqs: list[Req]) -> int:
        return len(reqs)

    def room(self, req: Req) -> int:
        return self.available()

    # ------------------------------------------------------------------ lifecycle
    def admit(self, req: Req) -> bool:
        """Give `req` a row and its longest cached prefix of at most `req.max_prefix_len`
        tokens (at least one token left to compute, input logprobs recomputed)."""
        row = self.rows.alloc()
        if row is None:
            return False
        key = req.tokens(0, req.max_prefix_len)
        slots, node = self.cache.match_prefix(key)
        self.cache.inc_lock(node)
        req.row, req.cache_node = row, node
        req.slots = slots
        req.prefix_pages = slots.tolist()
        req.cached_len = req.kv_len = len(slots)
        return True

    def alloc(self, req: Req, n: int) -> np.ndarray | None:
        """Slots for the next `n` positions of `req` (evicting cached prefixes if needed)."""
        if self.allocator.available < n:
            self.cache.evict(n - self.allocator.available)
        slots = self.allocator.alloc(n)
        if slots is None:
            return None
        req.add_slots(slots)
        return slots

    def alloc_decode(self, reqs: list[Req]) -> np.ndarray:
        """One slot for the next position of each of `reqs` (room was reserved): [len] int32."""
        n = len(reqs)
        if self.allocator.available < n:
            self.cache.evict(n - self.allocator.available)
        slots = self.allocator.alloc(n)
        for req, slot in zip(reqs, slots.tolist()):
            req.add_slot(slot)
        return slots

    def release(self, req: Req, *, cache: bool) -> None:
        """Return everything `req` holds. With `cache`, its computed KV goes to the radix tree."""
        own = req.slots[req.cached_len:req.kv_len]
        if cache and req.kv_len > 0:
            key = req.tokens(0, req.kv_len)
            dup = self.cache.insert(key, req.slots[:req.kv_len])
            # the tree already held [0, dup): our copies of [cached_len, dup) are duplicates
            self.allocator.free(req.slots[req.cached_len:max(dup, req.cached_len)])
        elif len(own):
            self.allocator.free(own)
        if req.cache_node is not None:
            self.cache.dec_lock(req.cache_node)
        if req.row is not None:
            self.rows.free(req.row)

    def check_invariants(self, live: list[Req]) -> None:
        """free + evictable + locked + held by requests == total; raises AssertionError."""
        in_use = sum(r.kv_len - r.cached_len for r in live if r.row is not None)
        self.cache.check_invariants(in_use)

    # ------------------------------------------------------------------ stats
    def occupancy(self) -> tuple[int, int]:
        """Token-granular: every reserved slot holds a token."""
        return self.used(), self.used()

    def stats_fields(self) -> dict[str, int]:
        return dict(kv_free=self.allocator.available, kv_cached=self.cache.evictable_size,
                    kv_held=self.used(),
                    prefix_hit_tokens=self.cache.hit_tokens,
                    prefix_query_tokens=self.cache.query_tokens)

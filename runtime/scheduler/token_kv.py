"""`TokenKV` (`--kv token`): token slots from a `TokenAllocator`, radix prefix cache, and
optionally a host tier under it (`HostTier`) or compressed-entry ids beside the slots
(`EntryIds`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.scheduler.entry_ids import EntryIds, EntryRadixCache, EntryTokenAllocator, take
from runtime.scheduler.host_tier import HostTier
from runtime.scheduler.kv_manager import KVManager
from runtime.scheduler.radix_cache import RadixCache, Space, TreeNode
from runtime.scheduler.req import Req
from runtime.scheduler.token_allocator import TokenAllocator


class TokenKV(KVManager[TreeNode]):
    """Any free slot for any position; a request's table is the radix node its cached
    prefix ends at, locked while it runs.

    A slot is in exactly one place: the allocator's free list, the radix tree
    (evictable or locked by a request's prefix), or a live request's own `slots`
    beyond its `cached_len`.

    With a `host` tier, the tree's evictions are written back to it and a prompt prefix
    found there is loaded back at admission (see `HostTier`). A request's prefixes are
    cached in the key space of its LoRA adapter (`Req.lora`) on both tiers.

    With `entries` (a model with compressed entries), each slot of a position closing a
    window holds an entry id of that window's rate, handed out and freed with it; a
    request's ids go to the worker with its next step (`Req.entry_writes`). Growth and
    admission need both, evicting while either is short; a host tier then carries the
    ids' entries with their slots (`HostTier` with entries of its own).
    """

    prefix_cache = True

    def __init__(self, num_slots: int, num_rows: int, host: HostTier | None = None,
                 entries: EntryIds | None = None) -> None:
        super().__init__(num_rows)
        self.host, self.entries = host, entries
        write_back = host.write_back if host is not None else None
        if entries is not None:
            if host is not None and host.entries is None:
                raise ValueError("the host tier must carry the compressed entries too")
            self.allocator = EntryTokenAllocator(num_slots, entries)
            self.cache = EntryRadixCache(self.allocator, write_back)
        else:
            self.allocator = TokenAllocator(num_slots)
            self.cache = RadixCache(self.allocator, write_back)

    @property
    def total(self) -> int:
        return self.allocator.total

    def room(self, req: Req) -> int:
        if self.entries is None:
            return self._available()
        return min(self._available(), self.entries.room(req.kv_len))

    def can_admit(self, req: Req, n: int, growth: Sequence[tuple[Req, int]] = (),
                  ratio: float = 0.0) -> bool:
        return super().can_admit(req, n, growth, ratio) and (
            self.entries is None or self.entries.fits(self.entries.span(req.kv_len, n)))

    def can_decode(self, reqs: list[Req], spare: int = 0) -> bool:
        return super().can_decode(reqs, spare) and (
            self.entries is None or self.entries.fits(self._decode_needs(reqs)))

    # ------------------------------------------------------------------ layout
    def _match(self, req: Req) -> tuple[TreeNode, np.ndarray]:
        """The longest cached prefix the model's rule allows (`aligned`; at least one token
        is left to compute)."""
        key = np.asarray(req.tokens(0, req.max_prefix_len), dtype=np.int32)
        slots, node = self.cache.match_prefix(key, req.lora)
        if self.host is not None:
            slots, node = self._load_back(key, slots, node, req.lora)
        if (n := self.aligned(len(slots))) < len(slots):
            slots, node = self.cache.match_prefix(key[:n], req.lora)
        self.cache.inc_lock(node)
        if self.entries is not None:
            req.entry_writes = self.entries.of_prefix(slots)
        return node, slots

    def _load_back(self, key: np.ndarray, slots: np.ndarray, node: TreeNode,
                   space: Space) -> tuple[np.ndarray, TreeNode]:
        """Extend the device match `slots` (ending at `node`) with what the host holds
        beyond it (up to an `aligned` end), loaded into fresh device slots; unchanged if the
        device has no room."""
        host = self.host.match(key, len(slots), space)
        host = host[: max(self.aligned(len(slots) + len(host)) - len(slots), 0)]
        if not len(host):
            return slots, node
        self.cache.inc_lock(node)  # making room must not evict the device prefix
        needs = None if self.entries is None else self.entries.span(len(slots), len(host))
        dev = self._take(len(host), needs)
        self.cache.dec_lock(node)
        if dev is None:
            return slots, node
        if self.entries is not None:  # the loaded windows' ids (sent with the prefix's)
            self.entries.assign_span(dev, len(slots))
        self.host.load(host, dev, len(slots))
        n = len(slots) + len(dev)
        dup = self.cache.insert(key[:n], np.concatenate([slots, dev]), space)
        assert dup == len(slots), (dup, len(slots))
        return self.cache.match_prefix(key[:n], space)

    def swap_out(self, req: Req) -> bool:
        """Cache its KV: evicted from the device, it goes to the host tier, and the prefix
        match of its re-admission finds it on either."""
        if self.host is None:
            return False
        self.release(req, cache=True)
        return True

    def _grow(self, req: Req, node: TreeNode, n: int) -> np.ndarray | None:
        if self.entries is None:
            return self._take(n)
        slots = self._take(n, self.entries.span(req.kv_len, n))
        if slots is not None:
            req.entry_writes += self.entries.assign_span(slots, req.kv_len)
        return slots

    def _grow_decode(self, reqs: list[Req]) -> np.ndarray:
        if self.entries is None:
            return self._take(len(reqs))
        positions = np.array([r.kv_len for r in reqs], dtype=np.int64)
        slots = self._take(len(reqs), self.entries.needs(positions))
        for m, at, ids in self.entries.assign(slots, positions):
            for i, entry in zip(at.tolist(), ids.tolist()):
                reqs[i].entry_writes.append((m, int(positions[i]) // m, [entry]))
        return slots

    def _decode_needs(self, reqs: list[Req]) -> dict[int, int]:
        return self.entries.needs(np.array([r.kv_len for r in reqs], dtype=np.int64))

    def _take(self, n: int, needs: dict[int, int] | None = None) -> np.ndarray | None:
        """`n` slots and room for the entry ids `needs` of each rate (evicting cached
        prefixes while either is short), or None."""
        return take(self.allocator, self.cache, n, self.entries, needs)

    def _shrink(self, req: Req, node: TreeNode, kv_len: int) -> None:
        self.allocator.free(req.slots[kv_len:req.kv_len])

    def _free(self, req: Req, node: TreeNode, cache: bool) -> None:
        """With `cache`, the computed KV goes to the radix tree."""
        if cache and req.kv_len > 0:
            dup = self.cache.insert(req.tokens(0, req.kv_len), req.slots[: req.kv_len], req.lora)
            # the tree already held [0, dup): our copies of [cached_len, dup) are duplicates
            self.allocator.free(req.slots[req.cached_len : max(dup, req.cached_len)])
        else:
            self.allocator.free(req.slots[req.cached_len : req.kv_len])
        self.cache.dec_lock(node)

    def flush_cache(self) -> int:
        return self.cache.evict(self.cache.evictable_size)

    def _available(self) -> int:
        return self.allocator.available + self.cache.evictable_size

    def _cached(self) -> int:
        return self.cache.evictable_size

    def _slots_needed(self, req: Req, n: int) -> int:
        return n

    def _check(self, live: list[Req]) -> None:
        """free + evictable + locked + held by requests == total, on each tier."""
        self.cache.check_invariants(sum(r.kv_len - r.cached_len for r in live))
        if self.host is not None:
            self.host.check_invariants()
        if self.entries is not None:
            self.entries.check(self.allocator, self.cache)

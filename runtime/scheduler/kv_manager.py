"""`KVManager`: how the Scheduler hands out KV, whatever the layout, and `KVStats`.

The worker keeps a page table per request row, `req_to_page[row, pos // page_size]`, and
receives only the ids of pages a step starts (page size 1: one slot per new position).
So every KV layout is a scheduler-side manager that maps positions to pages of the same
pool (`kv_slots + 1` slots, slot 0 the padding sink; page p holds slots
p * page_size .. p * page_size + page_size - 1). The serving layouts:

- `TokenKV` (`--kv token`): any free slot, radix prefix cache.
- `PagedKV` (`--kv paged`): slot = block_id * block_size + offset, block-hash prefix cache.

`runtime/scheduler/kv_study/` holds the layouts kept to measure against them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from runtime.scheduler.host_tier import CopyOrders, HostStats, HostTier
from runtime.scheduler.req import Req
from runtime.scheduler.row_pool import RowPool

Table = TypeVar("Table")  # what a layout keeps per admitted request

NO_PAGES = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True)
class KVStats:
    """A snapshot of the pool, in slots (the prefix counters in tokens)."""

    total: int  # usable slots
    free: int  # holding nothing
    cached: int  # free to take, but holding a cached prefix until evicted
    used: int  # total - free - cached: held by running requests
    reserved: int  # of used, inside running requests' allocations (less: stranded space)
    live: int  # of reserved, holding a token's KV
    prefix_query_tokens: int  # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int  # of which found there (on any tier)
    host: HostStats | None = None  # the host tier, if there is one


class KVManager(ABC, Generic[Table]):
    """Owns every KV slot and request row; requests borrow them.

    The contract: `admit` a request (a row and its cached prefix), ask whether its first
    chunk fits (`can_admit`), how far a running one can grow (`room`) and whether every
    decode gets its next position (`can_decode`); `try_alloc` / `alloc_decode` give
    positions their pages, `release` takes everything back, `stats` and
    `check_invariants` look at the pool.

    This base holds what every layout shares: the rows, one `Table` per admitted request
    (`tables[rid]`), the request's prefix and, with page size 1 (a page is a slot), its
    `Req.slots`, and the prefix-cache counters. A layout implements the abstract methods
    and may override the other underscored ones; its `_match` keeps to `aligned` hits.
    """

    page_size = 1  # slots per page of the worker's page table
    prefix_cache = False  # admission looks up cached prefixes (counted in `stats`)
    # the model's rule for prefix hits (`WorkerReady`): a hit is a multiple of
    # `prefix_align` tokens, and its first step computes its last `prefix_replay` again
    prefix_align = 1
    prefix_replay = 0
    host: HostTier | None = None  # the host-memory tier under the pool, if any

    def __init__(self, num_rows: int) -> None:
        self.rows = RowPool(num_rows)
        self.tables: dict[str, Table] = {}  # by request id, while admitted
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    @abstractmethod
    def total(self) -> int:
        """Usable slots."""

    # ------------------------------------------------------------------ lifecycle
    def admit(self, req: Req) -> bool:
        """Give a waiting `req` a row and its longest cached prefix of at most
        `req.max_prefix_len` tokens (`req.cached_len` positions on the pages
        `req.prefix_pages`); False if it cannot start now (nothing taken)."""
        row = self.rows.alloc()
        if row is None:
            return False
        matched = self._match(req)
        if matched is None:
            self.rows.free(row)
            return False
        table, pages = matched
        self.tables[req.rid] = table
        req.row = row
        req.prefix_pages = pages.tolist()
        req.cached_len = req.kv_len = len(pages) * self.page_size
        if self.page_size == 1:
            req.slots = pages
        if req.cached_len and self.prefix_replay:
            start = req.cached_len - self.prefix_replay
            req.replay = self.prefix_replay
            req.replay_pages = req.prefix_pages[-(-start // self.page_size) :]
        if self.prefix_cache:
            self.prefix_query_tokens += req.max_prefix_len
            self.prefix_hit_tokens += req.cached_len
        return True

    def try_alloc(self, req: Req, n: int) -> np.ndarray | None:
        """Room for positions kv_len .. kv_len + n - 1 of an admitted `req`: the ids of the
        pages they start (int32, possibly empty), or None (nothing taken)."""
        pages = self._grow(req, self.tables[req.rid], n)
        if pages is not None and self.page_size == 1:
            req.add_slots(pages)
        return pages

    def alloc_decode(self, reqs: list[Req]) -> np.ndarray:
        """`try_alloc(req, 1)` for each of `reqs`, for which `can_decode` said yes: the new
        page ids, concatenated in order. The decode hot path: one call per step."""
        pages = self._grow_decode(reqs)
        if self.page_size == 1:
            for req, slot in zip(reqs, pages.tolist()):
                req.add_slot(slot)
        return pages

    def release(self, req: Req, *, cache: bool) -> None:
        """Return everything `req` holds; with `cache`, keep its computed KV for reuse
        (layouts without a prefix cache ignore it)."""
        table = self.tables.pop(req.rid, None)
        if table is not None:
            self._free(req, table, cache)
        if req.row is not None:
            self.rows.free(req.row)

    def truncate(self, req: Req, kv_len: int) -> None:
        """Give back the space of positions kv_len .. req.kv_len - 1 of an admitted `req`:
        the rejected drafts of its verify step, once that step's batch completed (no other
        batch reads them: a speculating request has one step in flight at most), or a
        finished request's last position, never to be cached (`Req.draft_kv_owed`)."""
        assert 0 < kv_len <= req.kv_len, (req, kv_len)
        if kv_len == req.kv_len:
            return
        self._shrink(req, self.tables[req.rid], kv_len)
        if self.page_size == 1:
            req.num_slots = kv_len
        req.kv_len = kv_len

    def swap_out(self, req: Req) -> bool:
        """Release a preempted `req` keeping its KV in the host tier, to load back when it
        is admitted again; False (nothing done) when the layout or the host cannot."""
        return False

    def forget(self, req: Req) -> None:
        """Drop whatever a waiting `req` still holds in the host tier (it ended)."""

    def aligned(self, tokens: int) -> int:
        """The longest prefix hit of at most `tokens` tokens the model's rule allows: a
        multiple of `prefix_align`, and none (0) if all of it would be replayed (its first
        step would start at position 0, as a new request's does)."""
        hit = tokens - tokens % self.prefix_align
        return hit if hit > self.prefix_replay else 0

    # ------------------------------------------------------------------ capacity
    def can_admit(
        self, req: Req, n: int, growth: Sequence[tuple[Req, int]] = (), ratio: float = 0.0
    ) -> bool:
        """Whether the admitted `req` can take `n` more positions now and still leave
        `ratio` x the space that each `(r, k)` of `growth` needs for `k` more."""
        need = self._slots_needed(req, n)
        if growth:
            need += int(ratio * sum(self._slots_needed(r, k) for r, k in growth))
        return self._available() >= need

    def can_decode(self, reqs: list[Req], spare: int = 0) -> bool:
        """Whether each of `reqs` can take one more position, `spare` slots left over."""
        return self._available() >= self._decode_need(reqs) + spare

    @abstractmethod
    def room(self, req: Req) -> int:
        """Positions `try_alloc(req, n)` can give the admitted `req` right now."""

    # ------------------------------------------------------------------ looking
    def stats(self) -> KVStats:
        """The pool's occupancy and the prefix-cache counters."""
        total, available, cached = self.total, self._available(), self._cached()
        used = total - available
        live, reserved = self._occupancy(used)
        return KVStats(
            total=total,
            free=available - cached,
            cached=cached,
            used=used,
            reserved=reserved,
            live=live,
            prefix_query_tokens=self.prefix_query_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
            host=self.host.stats() if self.host is not None else None,
        )

    def take_copies(self) -> CopyOrders | None:
        """KV copies between the device and the host tier ordered since the last call, for
        the next step to run before its forward; None: none (or no host tier)."""
        return self.host.take_orders() if self.host is not None else None

    def flush_cache(self) -> int:
        """Drop every cached prefix no request holds; return the slots freed (layouts
        without a prefix cache have none)."""
        return 0

    def check_invariants(self, live: list[Req]) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (`live` hold KV)."""
        assert {r.rid for r in live} == set(self.tables), "KV tables and live requests differ"
        held = self.rows.total - self.rows.available
        assert held == len(self.tables), f"{held} rows held by {len(self.tables)} requests"
        self._check(live)

    # ------------------------------------------------------------------ layout
    @abstractmethod
    def _match(self, req: Req) -> tuple[Table, np.ndarray] | None:
        """The table of a request being admitted and the pages of its cached prefix
        (int32), or None if it cannot start now."""

    @abstractmethod
    def _grow(self, req: Req, table: Table, n: int) -> np.ndarray | None:
        """`try_alloc` without the `Req.slots` bookkeeping."""

    def _grow_decode(self, reqs: list[Req]) -> np.ndarray:
        """`alloc_decode` without the `Req.slots` bookkeeping; a layout may batch it."""
        tables = self.tables
        return np.concatenate([self._grow(r, tables[r.rid], 1) for r in reqs] or [NO_PAGES])

    def _shrink(self, req: Req, table: Table, kv_len: int) -> None:
        """`truncate` without the `Req` bookkeeping (`req.kv_len` is still the old end)."""
        raise NotImplementedError(f"{type(self).__name__} cannot give back positions")

    @abstractmethod
    def _free(self, req: Req, table: Table, cache: bool) -> None:
        """Return the space `table` holds."""

    @abstractmethod
    def _available(self) -> int:
        """Slots a request can obtain now (free, or cached and evictable)."""

    def _cached(self) -> int:
        """Of `_available()`, slots holding a cached prefix."""
        return 0

    @abstractmethod
    def _slots_needed(self, req: Req, n: int) -> int:
        """Slots of `_available()` that giving `req` `n` more positions takes."""

    def _decode_need(self, reqs: list[Req]) -> int:
        """Slots of `_available()` that one more position for each of `reqs` takes."""
        return len(reqs)

    def _occupancy(self, used: int) -> tuple[int, int]:
        """(slots holding tokens, slots in requests' allocations), given `used`: every
        used slot holds a token unless a layout reserves ahead."""
        return used, used

    @abstractmethod
    def _check(self, live: list[Req]) -> None:
        """The invariants of its own pool and tables."""

"""`KVManager`: the interface the Scheduler uses to hand out KV slots, whatever the layout.

The worker keeps a page table per request row, `req_to_page[row, pos // page_size]`, and
receives only the ids of pages a step starts (page size 1: one slot per new position).
So every KV mode is a scheduler-side manager that maps positions to pages of the same
pool (`kv_slots + 1` slots, slot 0 the padding sink; page p holds slots
p * page_size .. p * page_size + page_size - 1):

- `TokenKV` (`--kv token`): any free slot, radix prefix cache (SGLang).
- `PagedKV` (`--kv paged`): slot = block_id * block_size + offset, hash prefix cache (vLLM).
- `DynamicPagedKV` (`--kv paged --block-size dynamic`): 16/32/64-slot blocks per request.
- `ContiguousKV` (`--kv contiguous`): slots start .. start + max_len - 1 reserved up front.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from runtime.scheduler.req import Req


class KVManager(Protocol):
    """Owns every KV slot and request row; requests borrow them through admit/alloc/release.

    Capacity is counted in slots of `available()`: whatever any request may still take.
    `slots_needed`/`decode_need` say how much of it growth costs (a paged request only
    takes a block when its last one is full; a contiguous one took its region up front),
    and `room` how far one request can grow now, counting space it already holds.
    """

    page_size: int  # slots per page of the worker's page table

    @property
    def total(self) -> int:
        """Usable slots."""

    def available(self) -> int:
        """Slots any request can obtain now (free, or cached and evictable)."""

    def used(self) -> int:
        """Slots held by running requests."""

    def slots_needed(self, req: Req, n: int) -> int:
        """Slots of `available()` that giving `req` `n` more positions consumes."""

    def decode_need(self, reqs: list[Req]) -> int:
        """Slots of `available()` that one more position for each of `reqs` consumes."""

    def room(self, req: Req) -> int:
        """Positions `alloc(req, n)` can give `req` right now."""

    def admit(self, req: Req) -> bool:
        """Give a waiting `req` a row and its cached prefix (`req.cached_len` positions on
        the pages `req.prefix_pages`); False if it cannot start now."""

    def alloc(self, req: Req, n: int) -> np.ndarray | None:
        """Room for positions kv_len .. kv_len + n - 1 of `req`: the ids of the pages they
        start (int32, possibly empty), or None (nothing taken)."""

    def alloc_decode(self, reqs: list[Req]) -> np.ndarray:
        """`alloc(req, 1)` for each of `reqs`, whose room `decode_need` reserved: the new
        page ids, concatenated in order. The decode hot path: one call per step."""

    def release(self, req: Req, *, cache: bool) -> None:
        """Return everything `req` holds; with `cache`, keep its computed KV for reuse."""

    def check_invariants(self, live: list[Req]) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (`live` hold KV)."""

    def occupancy(self) -> tuple[int, int]:
        """(live tokens, reserved slots): fragmentation is 1 - live / reserved."""

    def stats_fields(self) -> dict[str, int]:
        """`SchedulerStats` fields: kv_free, kv_cached (free but holding a cached prefix),
        kv_held (slots holding tokens, of kv_used), prefix_hit_tokens, prefix_query_tokens."""

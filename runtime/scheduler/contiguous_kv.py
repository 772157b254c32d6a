"""`ContiguousKV`: the contiguous baseline (`--kv contiguous`).

Admission reserves one contiguous region for the request's maximum length: prompt +
max_tokens (`--reserve request`) or the whole context (`--reserve max`). The request then
grows inside it and never needs more memory, so it is never retracted; a request whose
region does not fit waits (admission stops, FCFS). No prefix sharing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.config import RESERVE_MODES
from runtime.scheduler.contiguous_pool import ContiguousPool
from runtime.scheduler.req import Req
from runtime.scheduler.row_pool import RowPool


@dataclass
class Region:
    """Slots start .. start + size - 1, the first `num_tokens` handed out."""

    start: int
    size: int
    num_tokens: int = 0


class ContiguousKV:
    """KV manager over a `ContiguousPool`: one region per admitted request."""

    page_size = 1  # the worker sees one page per slot

    def __init__(self, num_slots: int, num_rows: int, reserve: str, max_context: int) -> None:
        if reserve not in RESERVE_MODES:
            raise ValueError(f"reserve must be one of {RESERVE_MODES}, got {reserve!r}")
        self.pool = ContiguousPool(num_slots)
        self.rows = RowPool(num_rows)
        self.reserve = reserve
        self.max_context = max_context
        self.regions: dict[str, Region] = {}  # by request id

    def region_size(self, req: Req) -> int:
        """The reservation: what `req` can ever hold (the scheduler rejects requests
        longer than `max_context`)."""
        if self.reserve == "max":
            return self.max_context
        return len(req.prompt_ids) + req.params.max_tokens

    # ------------------------------------------------------------------ capacity
    @property
    def total(self) -> int:
        return self.pool.total

    def available(self) -> int:
        """Slots outside every region (a new request needs one free run of its size)."""
        return self.pool.available

    def used(self) -> int:
        return self.pool.reserved

    def slots_needed(self, req: Req, n: int) -> int:
        return 0  # growth stays inside the region reserved at admission

    def decode_need(self, reqs: list[Req]) -> int:
        return 0

    def room(self, req: Req) -> int:
        region = self.regions[req.rid]
        return region.size - region.num_tokens

    # ------------------------------------------------------------------ lifecycle
    def admit(self, req: Req) -> bool:
        """A row and a region of `region_size(req)` slots, or False (nothing taken)."""
        if self.rows.available == 0:
            return False
        start = self.pool.reserve(self.region_size(req))
        if start is None:
            return False
        self.regions[req.rid] = Region(start, self.region_size(req))
        req.row = self.rows.alloc()
        req.cached_len = req.kv_len = 0
        return True

    def alloc(self, req: Req, n: int) -> np.ndarray:
        """The next `n` slots of the region (never fails: it was sized for the maximum)."""
        region = self.regions[req.rid]
        assert region.num_tokens == req.kv_len and req.kv_len + n <= region.size, (
            f"{req} outgrows its region of {region.size}")
        slots = np.arange(region.start + region.num_tokens, region.start + region.num_tokens + n,
                          dtype=np.int32)
        region.num_tokens += n
        req.add_slots(slots)
        return slots

    def alloc_decode(self, reqs: list[Req]) -> np.ndarray:
        """`alloc(req, 1)` for each of `reqs` (room was reserved), concatenated."""
        return np.concatenate([self.alloc(r, 1) for r in reqs] or [np.zeros(0, np.int32)])

    def release(self, req: Req, *, cache: bool) -> None:
        """Free the region and the row (`cache` is ignored: nothing is shared)."""
        region = self.regions.pop(req.rid, None)
        if region is not None:
            self.pool.release(region.start)
        if req.row is not None:
            self.rows.free(req.row)

    def check_invariants(self, live: list[Req]) -> None:
        """One region per live request, its slots the region's first kv_len, and the pool's
        reserved slots exactly the regions' (regions cannot overlap: the pool's free list
        and reservations partition the slots)."""
        assert {r.rid for r in live} == set(self.regions), "regions and live requests differ"
        for req in live:
            region = self.regions[req.rid]
            assert region.num_tokens == req.kv_len <= region.size, (req, region)
            want = np.arange(region.start, region.start + req.kv_len)
            assert np.array_equal(req.slots[:req.kv_len], want), f"{req.rid}: slots != region"
        assert self.pool.reserved == sum(r.size for r in self.regions.values())

    # ------------------------------------------------------------------ stats
    def occupancy(self) -> tuple[int, int]:
        return sum(r.num_tokens for r in self.regions.values()), self.pool.reserved

    def stats_fields(self) -> dict[str, int]:
        live, reserved = self.occupancy()
        return dict(kv_free=self.available(), kv_cached=0, kv_held=live,
                    prefix_hit_tokens=0, prefix_query_tokens=0)

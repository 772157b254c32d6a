"""`ContiguousKV`: the contiguous baseline (`--kv contiguous`).

Admission reserves one contiguous region for the request's maximum length: prompt +
max_tokens (`--reserve request`) or the whole context (`--reserve max`). The request then
grows inside it and never needs more memory, so it is never retracted; a request whose
region does not fit waits (admission stops, FCFS). No prefix sharing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.config.scheduling import RESERVE_MODES
from runtime.scheduler.kv_manager import NO_PAGES, KVManager
from runtime.scheduler.kv_study.contiguous_pool import ContiguousPool
from runtime.scheduler.req import Req


@dataclass
class Region:
    """Slots start .. start + size - 1, the first `num_tokens` handed out."""

    start: int
    size: int
    num_tokens: int = 0


class ContiguousKV(KVManager[Region]):
    """KV manager over a `ContiguousPool`: one region per admitted request."""

    def __init__(self, num_slots: int, num_rows: int, reserve: str, max_context: int) -> None:
        if reserve not in RESERVE_MODES:
            raise ValueError(f"reserve must be one of {RESERVE_MODES}, got {reserve!r}")
        super().__init__(num_rows)
        self.pool = ContiguousPool(num_slots)
        self.reserve = reserve
        self.max_context = max_context

    def region_size(self, req: Req) -> int:
        """The reservation: what `req` can ever hold (the scheduler rejects requests
        longer than `max_context`)."""
        if self.reserve == "max":
            return self.max_context
        return len(req.prompt_ids) + req.params.max_tokens

    @property
    def total(self) -> int:
        return self.pool.total

    def room(self, req: Req) -> int:
        region = self.tables[req.rid]
        return region.size - region.num_tokens

    # ------------------------------------------------------------------ layout
    def _match(self, req: Req) -> tuple[Region, np.ndarray] | None:
        """A region of `region_size(req)` slots, or None; no prefix sharing."""
        size = self.region_size(req)
        start = self.pool.reserve(size)
        return None if start is None else (Region(start, size), NO_PAGES)

    def _grow(self, req: Req, region: Region, n: int) -> np.ndarray:
        """The next `n` slots of the region (never fails: it was sized for the maximum)."""
        assert region.num_tokens == req.kv_len and req.kv_len + n <= region.size, (
            f"{req} outgrows its region of {region.size}"
        )
        first = region.start + region.num_tokens
        region.num_tokens += n
        return np.arange(first, first + n, dtype=np.int32)

    def _shrink(self, req: Req, region: Region, kv_len: int) -> None:
        region.num_tokens = kv_len  # the region stays reserved for the request's growth

    def _free(self, req: Req, region: Region, cache: bool) -> None:
        self.pool.release(region.start)

    def _available(self) -> int:
        """Slots outside every region (a new request needs one free run of its size)."""
        return self.pool.available

    def _slots_needed(self, req: Req, n: int) -> int:
        return 0  # growth stays inside the region reserved at admission

    def _decode_need(self, reqs: list[Req]) -> int:
        return 0

    def _occupancy(self, used: int) -> tuple[int, int]:
        return sum(r.num_tokens for r in self.tables.values()), self.pool.reserved

    def _check(self, live: list[Req]) -> None:
        """Each live request's slots are its region's first kv_len, and the pool's reserved
        slots exactly the regions' (regions cannot overlap: the pool's free list and
        reservations partition the slots)."""
        for req in live:
            region = self.tables[req.rid]
            assert region.num_tokens == req.kv_len <= region.size, (req, region)
            want = np.arange(region.start, region.start + req.kv_len)
            assert np.array_equal(req.slots[: req.kv_len], want), f"{req.rid}: slots != region"
        assert self.pool.reserved == sum(r.size for r in self.tables.values())

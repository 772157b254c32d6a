"""`DynamicPagedKV`: paged KV whose block size is chosen per request (`--block-size dynamic`).

The scheme: short requests get small blocks (less waste in the last block), long
ones large blocks (fewer blocks per table). The size class comes from the request's
maximum length, prompt + max_tokens: < 512 -> 16, < 2048 -> 32, else 64.

Limits, by design: no prefix caching (hash chains of different block sizes would not
match each other), and a size class cannot use another class's free blocks until their
superblock drains (`SuperblockPool.stranded`). `bench/fragmentation.py` measures what
the scheme saves against fixed sizes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from runtime.scheduler.paged_kv import block_slots
from runtime.scheduler.req import Req
from runtime.scheduler.row_pool import RowPool
from runtime.scheduler.superblock_pool import SuperblockPool

SIZE_CLASSES = ((512, 16), (2048, 32), (None, 64))  # (length below, block size)


def block_size_for(max_len: int) -> int:
    """The block size of a request that may reach `max_len` tokens."""
    return next(size for limit, size in SIZE_CLASSES if limit is None or max_len < limit)


@dataclass
class SizedTable:
    """A request's blocks (first slots, position order), all of `size` slots."""

    size: int
    starts: list[int] = field(default_factory=list)
    num_tokens: int = 0


class DynamicPagedKV:
    """KV manager over a `SuperblockPool`; `available()` counts whole free superblocks,
    the only space every size class can use."""

    page_size = 1  # the worker sees one page per slot

    def __init__(self, num_slots: int, num_rows: int) -> None:
        self.pool = SuperblockPool(num_slots, tuple(size for _, size in SIZE_CLASSES))
        self.rows = RowPool(num_rows)
        self.tables: dict[str, SizedTable] = {}  # by request id

    def _size(self, req: Req) -> int:
        table = self.tables.get(req.rid)
        return table.size if table else block_size_for(len(req.prompt_ids) + req.params.max_tokens)

    def _blocks_missing(self, req: Req, n: int) -> int:
        table = self.tables.get(req.rid)
        held = len(table.starts) if table else 0
        return max(0, -(-(req.kv_len + n) // self._size(req)) - held)

    def _superblock_slots(self, size: int, blocks: int) -> int:
        """Slots of whole superblocks that `blocks` more blocks of `size` take."""
        per = self.pool.superblock // size
        split = -(-max(0, blocks - self.pool.num_free_blocks(size)) // per)
        return split * self.pool.superblock

    # ------------------------------------------------------------------ capacity
    @property
    def total(self) -> int:
        return self.pool.total

    def available(self) -> int:
        return self.pool.num_free_superblocks * self.pool.superblock

    def used(self) -> int:
        return self.total - self.available()

    def slots_needed(self, req: Req, n: int) -> int:
        return self._superblock_slots(self._size(req), self._blocks_missing(req, n))

    def decode_need(self, reqs: list[Req]) -> int:
        wanted = Counter(self._size(r) for r in reqs if self._blocks_missing(r, 1))
        return sum(self._superblock_slots(size, k) for size, k in wanted.items())

    def room(self, req: Req) -> int:
        table = self.tables[req.rid]
        own = len(table.starts) * table.size - table.num_tokens
        return own + table.size * self.pool.capacity(table.size)

    # ------------------------------------------------------------------ lifecycle
    def admit(self, req: Req) -> bool:
        """A row and an empty table of the request's size class (no prefix cache)."""
        row = self.rows.alloc()
        if row is None:
            return False
        self.tables[req.rid] = SizedTable(self._size(req))
        req.row = row
        req.cached_len = req.kv_len = 0
        return True

    def alloc(self, req: Req, n: int) -> np.ndarray | None:
        table = self.tables[req.rid]
        assert table.num_tokens == req.kv_len, (req, table.num_tokens)
        missing = self._blocks_missing(req, n)
        if missing:
            new = self.pool.allocate(table.size, missing)
            if new is None:
                return None
            table.starts += new
        slots = block_slots(table.starts, table.size, table.num_tokens, n)
        table.num_tokens += n
        req.add_slots(slots)
        return slots

    def alloc_decode(self, reqs: list[Req]) -> np.ndarray:
        """`alloc(req, 1)` for each of `reqs` (room was reserved), concatenated."""
        return np.concatenate([self.alloc(r, 1) for r in reqs] or [np.zeros(0, np.int32)])

    def release(self, req: Req, *, cache: bool) -> None:
        """Free the request's blocks and row (`cache` is ignored: no prefix cache)."""
        table = self.tables.pop(req.rid, None)
        if table is not None:
            self.pool.free(table.starts)
        if req.row is not None:
            self.rows.free(req.row)

    def check_invariants(self, live: list[Req]) -> None:
        """Pool invariants; one table per live request matching its slots; the pool holds
        exactly the tables' blocks."""
        self.pool.check_invariants()
        assert {r.rid for r in live} == set(self.tables), "block tables and live requests differ"
        for req in live:
            table = self.tables[req.rid]
            assert table.num_tokens == req.kv_len and len(table.starts) == -(
                -table.num_tokens // table.size), (req, table)
            want = block_slots(table.starts, table.size, 0, req.kv_len)
            assert np.array_equal(req.slots[:req.kv_len], want), f"{req.rid}: slots != blocks"
        held = sum(len(t.starts) * t.size for t in self.tables.values())
        assert held == self.pool.reserved, f"tables hold {held} slots, pool {self.pool.reserved}"

    # ------------------------------------------------------------------ stats
    def occupancy(self) -> tuple[int, int]:
        return sum(t.num_tokens for t in self.tables.values()), self.pool.reserved

    def stats_fields(self) -> dict[str, int]:
        live, reserved = self.occupancy()
        return dict(kv_free=self.available(), kv_cached=0, kv_held=live,
                    prefix_hit_tokens=0, prefix_query_tokens=0)

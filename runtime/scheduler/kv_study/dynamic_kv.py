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

from runtime.scheduler.kv_manager import NO_PAGES, KVManager
from runtime.scheduler.kv_study.superblock_pool import SuperblockPool
from runtime.scheduler.req import Req

SIZE_CLASSES = ((512, 16), (2048, 32), (None, 64))  # (length below, block size)


def block_slots(starts: list[int], block_size: int, pos: int, n: int) -> np.ndarray:
    """Slots of positions pos .. pos + n - 1 given each block's first slot: [n] int32."""
    p = np.arange(pos, pos + n)
    first = np.asarray(starts[pos // block_size : (pos + n - 1) // block_size + 1], np.int64)
    return (first[p // block_size - pos // block_size] + p % block_size).astype(np.int32)


def block_size_for(max_len: int) -> int:
    """The block size of a request that may reach `max_len` tokens."""
    return next(size for limit, size in SIZE_CLASSES if limit is None or max_len < limit)


@dataclass
class SizedTable:
    """A request's blocks (first slots, position order), all of `size` slots."""

    size: int
    starts: list[int] = field(default_factory=list)
    num_tokens: int = 0


class DynamicPagedKV(KVManager[SizedTable]):
    """KV manager over a `SuperblockPool`; `_available()` counts whole free superblocks,
    the only space every size class can use."""

    def __init__(self, num_slots: int, num_rows: int) -> None:
        super().__init__(num_rows)
        self.pool = SuperblockPool(num_slots, tuple(size for _, size in SIZE_CLASSES))

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

    @property
    def total(self) -> int:
        return self.pool.total

    def room(self, req: Req) -> int:
        table = self.tables[req.rid]
        own = len(table.starts) * table.size - table.num_tokens
        return own + table.size * self.pool.capacity(table.size)

    # ------------------------------------------------------------------ layout
    def _match(self, req: Req) -> tuple[SizedTable, np.ndarray]:
        """An empty table of the request's size class (no prefix cache)."""
        return SizedTable(self._size(req)), NO_PAGES

    def _grow(self, req: Req, table: SizedTable, n: int) -> np.ndarray | None:
        assert table.num_tokens == req.kv_len, (req, table.num_tokens)
        missing = self._blocks_missing(req, n)
        if missing:
            new = self.pool.allocate(table.size, missing)
            if new is None:
                return None
            table.starts += new
        slots = block_slots(table.starts, table.size, table.num_tokens, n)
        table.num_tokens += n
        return slots

    def _free(self, req: Req, table: SizedTable, cache: bool) -> None:
        self.pool.free(table.starts)

    def _available(self) -> int:
        return self.pool.num_free_superblocks * self.pool.superblock

    def _slots_needed(self, req: Req, n: int) -> int:
        return self._superblock_slots(self._size(req), self._blocks_missing(req, n))

    def _decode_need(self, reqs: list[Req]) -> int:
        wanted = Counter(self._size(r) for r in reqs if self._blocks_missing(r, 1))
        return sum(self._superblock_slots(size, k) for size, k in wanted.items())

    def _occupancy(self, used: int) -> tuple[int, int]:
        """Free blocks of split superblocks count as used (stranded), not reserved."""
        return sum(t.num_tokens for t in self.tables.values()), self.pool.reserved

    def _check(self, live: list[Req]) -> None:
        """Pool invariants; each live request's table matches its slots; the pool holds
        exactly the tables' blocks."""
        self.pool.check_invariants()
        for req in live:
            table = self.tables[req.rid]
            assert table.num_tokens == req.kv_len and len(table.starts) == -(
                -table.num_tokens // table.size
            ), (req, table)
            want = block_slots(table.starts, table.size, 0, req.kv_len)
            assert np.array_equal(req.slots[: req.kv_len], want), f"{req.rid}: slots != blocks"
        held = sum(len(t.starts) * t.size for t in self.tables.values())
        assert held == self.pool.reserved, f"tables hold {held} slots, pool {self.pool.reserved}"

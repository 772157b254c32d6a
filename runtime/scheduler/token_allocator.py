"""`TokenAllocator`: token-granular KV slots (the `token` KV mode).

The worker owns the KV tensors (per layer `[num_slots + 1, kv_heads, head_dim]`) and the
per-row page table (page size 1 here: a page is a slot); the scheduler only hands out ids
from here.
"""

from __future__ import annotations

import numpy as np

from runtime.scheduler.row_pool import AllocatorError


class TokenAllocator:
    """Free list over KV slots 1..num_slots; slot 0 is the padding sink and never handed out.

    The free slots live in a FIFO ring (numpy int32): `alloc` takes from the head, `free`
    appends at the tail, so a freed slot is reused as late as possible and a fresh pool
    hands out ascending, contiguous slots. A boolean in-use bitmap makes the double-free
    check O(len(slots)) per call; everything is vectorized, no per-slot Python loop.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.total = num_slots  # usable slots (excluding the padding sink)
        self._ring = np.arange(1, num_slots + 1, dtype=np.int32)  # [num_slots] free slot ids
        self._head = 0  # ring index of the next slot to hand out
        self._free_count = num_slots
        self._in_use = np.zeros(num_slots + 1, dtype=np.bool_)  # [num_slots + 1], by slot id
        self._in_use[0] = True  # the padding sink is permanently taken
        self._stamp = np.zeros(num_slots + 1, dtype=np.int32)  # scratch for duplicate checks

    @property
    def available(self) -> int:
        """Slots free right now."""
        return self._free_count

    def alloc(self, n: int) -> np.ndarray | None:
        """`n` distinct free slots as int32, or None (and nothing taken) if fewer are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} slots")
        if n > self._free_count:
            return None
        idx = self._ring_positions(self._head, n)
        slots = self._ring[idx]
        self._head = (self._head + n) % self.total
        self._free_count -= n
        self._in_use[slots] = True
        return slots

    def free(self, slots: np.ndarray | list[int]) -> None:
        """Return slots to the pool. Raises AllocatorError (freeing nothing) if any slot is
        out of range, the padding sink, repeated in `slots`, or not currently allocated."""
        slots = np.asarray(slots, dtype=np.int64).ravel()
        if slots.size == 0:
            return
        self._check_allocated(slots)
        tail = (self._head + self._free_count) % self.total
        self._ring[self._ring_positions(tail, slots.size)] = slots
        self._free_count += slots.size
        self._in_use[slots] = False

    def is_allocated(self, slots: np.ndarray) -> np.ndarray:
        """Boolean mask: which of `slots` (each in 1..total) are currently handed out."""
        return self._in_use[np.asarray(slots, dtype=np.int64)]

    def _ring_positions(self, start: int, n: int) -> np.ndarray:
        return (start + np.arange(n)) % self.total

    def _check_allocated(self, slots: np.ndarray) -> None:
        lo, hi = int(slots.min()), int(slots.max())
        if lo < 1 or hi > self.total:
            raise AllocatorError(
                f"free of slot outside 1..{self.total} (got min {lo}, max {hi}; 0 is the sink)"
            )
        # duplicates within this call: scatter positions, a repeated slot keeps only one of them
        positions = np.arange(slots.size, dtype=np.int32)
        self._stamp[slots] = positions
        repeated = self._stamp[slots] != positions
        if repeated.any():
            raise AllocatorError(f"slot {int(slots[repeated][0])} freed twice in one call")
        not_held = ~self._in_use[slots]
        if not_held.any():
            raise AllocatorError(
                f"double free: slot {int(slots[not_held][0])} is not allocated "
                f"({int(not_held.sum())} of {slots.size} slots in this call)"
            )

"""`RowPool`: the request rows every KV mode hands out, and `AllocatorError`.

A row is a request's line in the worker's tables (`req_to_page[row]`, `last_ids[row]`,
the sampler's parameters); the scheduler binds one per admitted request.
"""

from __future__ import annotations


class AllocatorError(RuntimeError):
    """A slot or row was freed twice, or was never handed out."""


class RowPool:
    """Allocator of request rows 0..num_rows-1."""

    def __init__(self, num_rows: int) -> None:
        if num_rows < 1:
            raise ValueError(f"num_rows must be >= 1, got {num_rows}")
        self._total = num_rows
        self._free = list(range(num_rows - 1, -1, -1))  # stack; row 0 is handed out first
        self._in_use = [False] * num_rows

    @property
    def total(self) -> int:
        return self._total

    @property
    def available(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        """A free row, or None if every row is taken."""
        if not self._free:
            return None
        row = self._free.pop()
        self._in_use[row] = True
        return row

    def free(self, row: int) -> None:
        """Return a row. Raises AllocatorError if it is out of range or not allocated."""
        if not 0 <= row < self._total:
            raise AllocatorError(f"row {row} outside 0..{self._total - 1}")
        if not self._in_use[row]:
            raise AllocatorError(f"double free of row {row}")
        self._in_use[row] = False
        self._free.append(row)

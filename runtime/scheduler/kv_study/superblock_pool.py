"""`SuperblockPool`: KV blocks of several sizes (16, 32, 64 slots) in one slot space.

Backs `--block-size dynamic`. The slots are cut into superblocks of the largest size;
superblock s covers slots s * S .. s * S + S - 1 (superblock 0 holds the padding sink and
is never used). A free superblock is split on demand into aligned blocks of one size
class and returns to the free list when its last block is freed. Classes never share a
superblock (segregated fit, not a buddy allocator): simple, and every block is aligned,
but a class's free blocks are stranded for the others until their superblock drains.
"""

from __future__ import annotations

from collections import deque

from runtime.scheduler.row_pool import AllocatorError


class SuperblockPool:
    """Allocator of aligned blocks by size class; block ids are their first slot."""

    def __init__(self, num_slots: int, sizes: tuple[int, ...] = (16, 32, 64)) -> None:
        self.superblock = max(sizes)
        if any(self.superblock % k for k in sizes):
            raise ValueError(f"block sizes {sizes} must divide {self.superblock}")
        num_super = (num_slots + 1) // self.superblock
        if num_super < 2:
            raise ValueError(f"{num_slots} slots hold no usable superblock of {self.superblock}")
        self.sizes = tuple(sorted(sizes))
        self.total = (num_super - 1) * self.superblock
        self._free_super: deque[int] = deque(range(1, num_super))
        self._free: dict[int, dict[int, None]] = {k: {} for k in self.sizes}  # ordered sets
        self._held: dict[int, int] = {}  # held block start -> size
        self._split: dict[int, tuple[int, int]] = {}  # superblock -> (size, blocks held)

    # ------------------------------------------------------------------ capacity
    @property
    def num_free_superblocks(self) -> int:
        return len(self._free_super)

    def num_free_blocks(self, size: int) -> int:
        """Free blocks of `size` in superblocks already split for that size."""
        return len(self._free[size])

    def capacity(self, size: int) -> int:
        """Blocks of `size` obtainable now."""
        return len(self._free[size]) + len(self._free_super) * (self.superblock // size)

    @property
    def reserved(self) -> int:
        """Slots in held blocks."""
        return sum(self._held.values())

    @property
    def stranded(self) -> int:
        """Free slots inside split superblocks: usable only by their own size class."""
        return sum(k * len(free) for k, free in self._free.items())

    # ------------------------------------------------------------------ alloc / free
    def allocate(self, size: int, n: int) -> list[int] | None:
        """First slots of `n` blocks of `size`, or None (nothing taken) if fewer fit.
        Free blocks of split superblocks go first, so fewer superblocks stay split."""
        if size not in self._free:
            raise ValueError(f"no block size {size} (have {self.sizes})")
        if n > self.capacity(size):
            return None
        out = []
        for _ in range(n):
            if not self._free[size]:
                sb = self._free_super.popleft()
                first = sb * self.superblock
                self._free[size].update(dict.fromkeys(range(first, first + self.superblock, size)))
                self._split[sb] = (size, 0)
            start = next(iter(self._free[size]))
            del self._free[size][start]
            sb = start // self.superblock
            self._split[sb] = (size, self._split[sb][1] + 1)
            self._held[start] = size
            out.append(start)
        return out

    def free(self, starts: list[int]) -> None:
        """Return blocks; a superblock whose blocks are all free becomes whole again."""
        for start in starts:
            size = self._held.pop(start, None)
            if size is None:
                raise AllocatorError(f"block at slot {start} is not held (double free?)")
            sb = start // self.superblock
            held = self._split[sb][1] - 1
            self._free[size][start] = None
            if held:
                self._split[sb] = (size, held)
                continue
            del self._split[sb]
            first = sb * self.superblock
            for s in range(first, first + self.superblock, size):
                del self._free[size][s]
            self._free_super.append(sb)

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Every usable superblock is free xor split; a split one's blocks are held or
        free exactly once, all of its size. Raises AssertionError."""
        free_super = set(self._free_super)
        assert len(free_super) == len(self._free_super), "a superblock is free twice"
        assert 0 not in free_super and 0 not in self._split, "superblock 0 is in use"
        assert not free_super & set(self._split), "a superblock is both free and split"
        assert len(free_super) + len(self._split) == self.total // self.superblock, (
            "a superblock is lost"
        )
        for sb, (size, held) in self._split.items():
            first = sb * self.superblock
            starts = range(first, first + self.superblock, size)
            n_held = sum(self._held.get(s) == size for s in starts)
            n_free = sum(s in self._free[size] for s in starts)
            assert n_held == held > 0 and n_held + n_free == len(starts), (
                f"superblock {sb}: {n_held} held (recorded {held}), {n_free} free"
            )
        split_blocks = sum(self.superblock // k for k, _ in self._split.values())
        assert len(self._held) + sum(map(len, self._free.values())) == split_blocks, (
            "a block is outside its superblock"
        )

"""`EntryIds`: the ids of compressed entries (DeepSeek-V4's windows) in the token layout,
handed out with the slots of the positions that close windows, and freed with them.

Per compression rate m (`WorkerReady.entry_ids`): ids 1..n of the worker's entry pool of
that rate (0 is its sink). Position p closes window p // m when (p + 1) % m == 0; the slot
given to such a position takes an id of each rate whose window it closes (`assign`), kept
by slot (`of_slot[m][slot]`, 0: none). So what owns the slot owns its ids: the running
request that computed it, then the radix tree (a split cuts a node's slots, and each id
stays with its slot), and freeing a slot frees its ids (`EntryTokenAllocator.free`: a
release, retraction or truncation, an eviction, a flush), each exactly once. A prefix
hit's ids are its slots' (`of_prefix`), sent with its admission. Ids can run short while
slots do not (cached branches inside a window each hold an id), so admission and growth
count both, and evict cached prefixes while either is short (`TokenKV`); the ids cached
prefixes no request locks hold are counted as the tree changes (`EntryRadixCache`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from runtime.scheduler.radix_cache import RadixCache, Space, TreeNode
from runtime.scheduler.token_allocator import TokenAllocator

Writes = list[tuple[int, int, list[int]]]  # (rate, first window, ids) of one request


class EntryIds:
    """Entry ids by rate over a pool of `num_slots` slots; `counts[m]` ids of rate m."""

    def __init__(self, num_slots: int, counts: dict[int, int]) -> None:
        self.rates = sorted(counts)
        self.pools = {m: TokenAllocator(counts[m]) for m in self.rates}
        self.of_slot = {m: np.zeros(num_slots + 1, dtype=np.int32) for m in self.rates}
        self.evictable = dict.fromkeys(self.rates, 0)  # held by unlocked cached prefixes

    def held(self, slots: np.ndarray) -> dict[int, int]:
        """Ids of each rate `slots` hold."""
        return {m: int(np.count_nonzero(self.of_slot[m][slots])) for m in self.rates}

    def available(self) -> dict[int, int]:
        """Ids of each rate free, or held by evictable cached prefixes."""
        return {m: self.pools[m].available + self.evictable[m] for m in self.rates}

    def needs(self, positions: np.ndarray) -> dict[int, int]:
        """Ids of each rate that slots for `positions` (int array) take."""
        return {m: int(np.count_nonzero((positions + 1) % m == 0)) for m in self.rates}

    def span(self, start: int, n: int) -> dict[int, int]:
        """`needs` of the positions start .. start + n - 1."""
        return {m: (start + n) // m - start // m for m in self.rates}

    def shortfall(self, needs: dict[int, int]) -> int:
        """Tokens of cached prefixes worth evicting for `needs`: m for each id of rate m
        lacking (0: none lacks)."""
        return max((max(k - self.pools[m].available, 0) * m for m, k in needs.items()),
                   default=0)

    def fits(self, needs: dict[int, int]) -> bool:
        """Whether `needs` can be had now, free or held by evictable cached prefixes."""
        have = self.available()
        return all(k <= have[m] for m, k in needs.items())

    def room(self, start: int) -> int:
        """Positions from `start` on whose windows the ids free, or held by evictable
        cached prefixes, cover."""
        have = self.available()
        return min((start // m + have[m] + 1) * m - 1 - start for m in self.rates)

    def assign(self, slots: np.ndarray, positions: np.ndarray) -> list[tuple[int, np.ndarray,
                                                                              np.ndarray]]:
        """Give each of `slots` (of `positions`, alike) that closes a window an id of its
        rate, which the caller made sure of (`shortfall`): per rate with any, (m, the
        indices into `slots` that close a window of m, their ids)."""
        out = []
        for m in self.rates:
            at = np.flatnonzero((positions + 1) % m == 0)
            if not at.size:
                continue
            ids = self.pools[m].alloc(at.size)
            assert ids is not None, f"{at.size} ids of rate {m}, {self.pools[m].available} free"
            self.of_slot[m][slots[at]] = ids
            out.append((m, at, ids))
        return out

    def assign_span(self, slots: np.ndarray, start: int) -> Writes:
        """`assign` for the positions start .. start + len(slots) - 1 of one request: its
        writes, each rate's windows in order."""
        positions = np.arange(start, start + len(slots))
        return [(m, int(positions[at[0]]) // m, ids.tolist())
                for m, at, ids in self.assign(slots, positions)]

    def ids_of(self, rate: int, slots: np.ndarray) -> np.ndarray:
        """The ids of `rate` that `slots` hold (0: none)."""
        return self.of_slot[rate][slots]

    def release(self, slots: np.ndarray) -> None:
        """Free the ids the freed `slots` held."""
        for m in self.rates:
            ids = self.of_slot[m][slots]
            held = ids != 0
            if held.any():
                self.pools[m].free(ids[held])
                self.of_slot[m][slots[held]] = 0

    def of_prefix(self, slots: np.ndarray) -> Writes:
        """The writes of a cached prefix on `slots` (its positions 0 on): each rate's
        windows it closes, from window 0."""
        return [(m, 0, self.of_slot[m][slots[m - 1 :: m]].tolist()) for m in self.rates
                if len(slots) >= m]

    def check(self, slots: TokenAllocator, cache: RadixCache) -> None:
        """Every id is held by exactly one allocated slot, each held id is handed out, and
        the evictable counts are the unlocked cached nodes' ids."""
        for m in self.rates:
            held = np.flatnonzero(self.of_slot[m])
            ids = self.of_slot[m][held]
            pool = self.pools[m]
            assert slots.is_allocated(held).all(), f"a free slot holds an id of rate {m}"
            assert np.unique(ids).size == ids.size, f"an id of rate {m} held by two slots"
            assert ids.size == pool.total - pool.available, (
                f"rate {m}: {ids.size} ids held by slots, {pool.total - pool.available} "
                "handed out")
        evictable = dict.fromkeys(self.rates, 0)
        for node in cache.nodes():
            if node.lock_ref == 0:
                for m, k in self.held(node.value).items():
                    evictable[m] += k
        assert evictable == self.evictable, f"evictable ids {self.evictable}, {evictable} held"


def paged_entry_ids(page_size: int, rate: int, slots: np.ndarray) -> np.ndarray:
    """The ids of `rate` the worker gives the windows closing at `slots` where ids follow
    pages of `page_size` (`kernels.sparse.index_lists.entry_of_slot`)."""
    return slots // page_size * -(-page_size // rate) + slots % page_size // rate


def take(allocator: TokenAllocator, cache: RadixCache, n: int, entries: EntryIds | None = None,
         needs: dict[int, int] | None = None) -> np.ndarray | None:
    """`n` slots of `allocator` and room for the ids `needs` of `entries`, evicting the
    least recently used prefixes of `cache` while either is short; None (nothing taken)
    if they do not fit even then."""

    def lacking() -> int:  # cached tokens to evict, at least
        short = n - allocator.available
        return short if needs is None else max(short, entries.shortfall(needs))

    short = lacking()
    while short > 0 and cache.evict(short):
        short = lacking()
    return None if short > 0 else allocator.alloc(n)


class EntryTokenAllocator(TokenAllocator):
    """A `TokenAllocator` whose freed slots give back their entry ids (`EntryIds`)."""

    def __init__(self, num_slots: int, entries: EntryIds) -> None:
        super().__init__(num_slots)
        self.entries = entries

    def free(self, slots: np.ndarray | list[int]) -> None:
        slots = np.asarray(slots, dtype=np.int64).ravel()
        super().free(slots)
        self.entries.release(slots)


class EntryRadixCache(RadixCache):
    """A `RadixCache` over an `EntryTokenAllocator` that keeps `EntryIds.evictable` (the
    ids of its unlocked nodes) as nodes are inserted, locked, unlocked and evicted."""

    def __init__(self, allocator: EntryTokenAllocator,
                 on_evict: Callable[[np.ndarray, np.ndarray, Space], None] | None = None) -> None:
        super().__init__(allocator, on_evict)
        self.entries = allocator.entries

    def insert(self, key: Sequence[int] | np.ndarray, slots: np.ndarray,
               space: Space = None) -> int:
        dup = super().insert(key, slots, space)
        self._count(np.asarray(slots)[dup:], 1)  # the new leaf, unlocked
        return dup

    def inc_lock(self, node: TreeNode) -> None:
        super().inc_lock(node)
        self._shift(node, 1, -1)  # the nodes it locked first

    def dec_lock(self, node: TreeNode) -> None:
        super().dec_lock(node)
        self._shift(node, 0, 1)  # the nodes it unlocked

    def evict(self, num_tokens: int) -> int:
        pools = self.entries.pools
        before = {m: pool.available for m, pool in pools.items()}
        freed = super().evict(num_tokens)
        for m, pool in pools.items():
            self.entries.evictable[m] -= pool.available - before[m]
        return freed

    def reset(self) -> None:
        super().reset()
        self.entries.evictable = dict.fromkeys(self.entries.rates, 0)

    def _shift(self, node: TreeNode, locks: int, sign: int) -> None:
        """Count (sign 1) or uncount (-1) the ids of the nodes from `node` up that now have
        `locks` locks."""
        while node.parent is not None:
            if node.lock_ref == locks:
                self._count(node.value, sign)
            node = node.parent

    def _count(self, slots: np.ndarray, sign: int) -> None:
        for m, k in self.entries.held(slots).items():
            self.entries.evictable[m] += sign * k

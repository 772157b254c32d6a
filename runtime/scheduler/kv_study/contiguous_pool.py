"""`ContiguousPool`: one contiguous region of KV slots per request (the `contiguous` mode).

The "original approach": at admission a request reserves room for its maximum length
(prompt + max new tokens) in one run of slots, held until it finishes. Simple indexing,
no prefix sharing, and memory reserved but not (yet) holding tokens: the waste that
paged and token-granular modes avoid, measured by `stats`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from runtime.scheduler.row_pool import AllocatorError


@dataclass(frozen=True)
class ContiguousStats:
    """Memory use of the pool given the live (KV-holding) token count."""

    total: int  # usable slots
    reserved: int  # slots inside reserved regions
    live: int  # of which hold KV of a token (reported by the caller)
    free: int
    largest_free_region: int
    num_free_regions: int

    @property
    def usage(self) -> float:
        """Fraction of the pool reserved."""
        return self.reserved / self.total

    @property
    def internal_fragmentation(self) -> float:
        """Fraction of reserved slots holding no token."""
        return (self.reserved - self.live) / self.reserved if self.reserved else 0.0

    @property
    def external_fragmentation(self) -> float:
        """Fraction of free slots outside the largest free region (unusable for a request
        needing all the free space)."""
        return 1.0 - self.largest_free_region / self.free if self.free else 0.0


class ContiguousPool:
    """First-fit region allocator over slots 1..num_slots (slot 0 is the padding sink).

    Free regions are kept sorted by start as parallel lists; `release` merges a region
    with free neighbours, so two adjacent free regions never coexist.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.total = num_slots
        self._free_starts = [1]  # sorted
        self._free_lens = [num_slots]
        self._reserved: dict[int, int] = {}  # start -> length

    @property
    def reserved(self) -> int:
        return self.total - sum(self._free_lens)

    @property
    def available(self) -> int:
        return sum(self._free_lens)

    def reserve(self, n: int) -> int | None:
        """Start slot of a fresh region of `n` slots (`start .. start + n - 1`): the lowest
        free region that fits. None if no single free region is large enough."""
        if n < 1:
            raise ValueError(f"cannot reserve {n} slots")
        for i, length in enumerate(self._free_lens):
            if length >= n:
                start = self._free_starts[i]
                if length == n:
                    del self._free_starts[i], self._free_lens[i]
                else:
                    self._free_starts[i] += n
                    self._free_lens[i] -= n
                self._reserved[start] = n
                return start
        return None

    def release(self, start: int) -> None:
        """Free the region reserved at `start`, merging it with adjacent free regions."""
        length = self._reserved.pop(start, None)
        if length is None:
            raise AllocatorError(f"no region reserved at slot {start} (double release?)")
        i = bisect.bisect_left(self._free_starts, start)
        if i > 0 and self._free_starts[i - 1] + self._free_lens[i - 1] == start:
            i -= 1  # extend the region on the left
            self._free_lens[i] += length
        else:
            self._free_starts.insert(i, start)
            self._free_lens.insert(i, length)
        end = self._free_starts[i] + self._free_lens[i]
        if i + 1 < len(self._free_starts) and self._free_starts[i + 1] == end:
            self._free_lens[i] += self._free_lens.pop(i + 1)
            del self._free_starts[i + 1]

    def stats(self, live_tokens: int) -> ContiguousStats:
        """Usage and fragmentation, given how many reserved slots hold KV right now."""
        reserved = self.reserved
        if not 0 <= live_tokens <= reserved:
            raise ValueError(f"{live_tokens} live tokens in {reserved} reserved slots")
        return ContiguousStats(
            total=self.total,
            reserved=reserved,
            live=live_tokens,
            free=self.total - reserved,
            largest_free_region=max(self._free_lens, default=0),
            num_free_regions=len(self._free_lens),
        )

"""`PrefixMap`: which replicas recently served which prompt prefixes.

A prompt's text is cut into blocks of `block_chars` characters; block i is known by the
hash of blocks 0..i (a chain), so one key names a whole prefix. Each key remembers the
replicas that served a prompt with that prefix; the least recently used keys are dropped
beyond `capacity`. A lookup walks the prompt's keys from the first and stops at the first
block no candidate replica holds: the replicas left hold the longest known prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class PrefixMap:
    def __init__(self, block_chars: int = 64, capacity: int = 65536) -> None:
        if block_chars < 1 or capacity < 1:
            raise ValueError("block_chars and capacity must be >= 1")
        self.block_chars = block_chars
        self.capacity = capacity
        self._holders: OrderedDict[int, set[str]] = OrderedDict()

    def _keys(self, text: str) -> list[int]:
        keys, key = [], 0
        for start in range(0, len(text) - self.block_chars + 1, self.block_chars):
            key = hash((key, text[start:start + self.block_chars]))
            keys.append(key)
        return keys

    def insert(self, text: str, replica: str) -> None:
        """Remember that `replica` served a prompt of `text`."""
        for key in self._keys(text):
            self._holders.setdefault(key, set()).add(replica)
            self._holders.move_to_end(key)
        while len(self._holders) > self.capacity:
            self._holders.popitem(last=False)

    def match(self, text: str, replicas: Iterable[str]) -> tuple[int, set[str]]:
        """(blocks matched, the replicas among `replicas` holding that many): (0, {}) when
        none holds even the first block."""
        best: set[str] = set()
        depth = 0
        live = set(replicas)
        for key in self._keys(text):
            live &= self._holders.get(key, set())
            if not live:
                break
            best, depth = set(live), depth + 1
            self._holders.move_to_end(key)
        return depth, best

    def remove(self, replica: str) -> None:
        """Forget `replica` (it stopped)."""
        for key in [k for k, holders in self._holders.items() if replica in holders]:
            holders = self._holders[key]
            holders.discard(replica)
            if not holders:
                del self._holders[key]

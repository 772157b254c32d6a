"""`HostTier`: the host-memory KV tier under the radix cache (`--host-kv-gib`).

The worker keeps a second KV pool in (pinned) host memory, laid out like the device pool;
this is its scheduler-side bookkeeping. The host tier is a radix tree of its own over
host slots: a prefix may be cached on the device, on the host, or on both.

- A node the device tree evicts is written back first: its path is inserted here, and
  the positions the host did not hold yet get host slots and a device-to-host copy order.
  A host too full for it evicts its own least recently used leaves; a node that does
  not fit even then is dropped, as without the tier.
- A prompt prefix found here beyond the device's match is loaded back: fresh device
  slots and a host-to-device copy order (`TokenKV` inserts them into the device tree).
- A preempted request's blocks (`PagedKV`, `--preempt swap`) are swapped out to host
  slots it holds outside the tree (`swap_out`) and loaded back when it is re-admitted.

With compressed entries (`EntryIds`, DeepSeek-V4's windows), the host slots of positions
closing windows hold host entry ids as the device's do in the token layout, handed out
and freed with them: a write-back or swap copies each such slot's entries from its device
id (`device_ids`: the id its slot holds, or the one its page gives) to its host id, a load
from its host id to its fresh device slot's.

The copy orders travel in the next `BatchPlan`, write-backs before loads. The worker runs
them before that step's forward, in order, on one copy stream that the forward waits
for, so a device slot freed here can be handed out in the same step and a host slot
reused by a later order never races an earlier one. Within one kind (one launch) a slot
is the destination of at most one order: a later order into a slot replaces an earlier
one, whose bytes were evicted meanwhile. Host slots a load reads stay
locked (or, swapped, held) until the plan carrying the load is built (`take_orders`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from runtime.scheduler.entry_ids import EntryIds, EntryRadixCache, EntryTokenAllocator, take
from runtime.scheduler.radix_cache import RadixCache, Space, TreeNode
from runtime.scheduler.token_allocator import TokenAllocator

_NONE = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True)
class CopyOrders:
    """Slot pairs to copy before a step's forward: write-backs (device -> host) first,
    then loads (host -> device); each a pair of equal-length int32 arrays; and the entry
    ids to copy with them, by rate: (device, host) write-backs, (host, device) loads."""

    writeback_dev: np.ndarray
    writeback_host: np.ndarray
    load_host: np.ndarray
    load_dev: np.ndarray
    entry_writeback: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    entry_load: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class HostStats:
    """The host tier's occupancy (slots) and traffic so far."""

    total: int  # host slots
    used: int  # holding a cached prefix
    hit_tokens: int  # prompt tokens loaded back from the host at admission
    writeback_tokens: int  # tokens copied device -> host
    load_tokens: int  # tokens copied host -> device
    writeback_bytes: int
    load_bytes: int


class HostTier:
    """Host slots 1..num_slots under a radix tree; collects the copy orders of a step.
    `bytes_per_token` (the pool's, all layers) turns token counts into bytes in `stats`.
    `entries`: the host entry ids of a model with compressed entries, and `device_ids(m,
    slots)` the device ids of rate m of device `slots` (those closing windows)."""

    def __init__(self, num_slots: int, bytes_per_token: int = 0,
                 entries: EntryIds | None = None,
                 device_ids: Callable[[int, np.ndarray], np.ndarray] | None = None) -> None:
        self.bytes_per_token = bytes_per_token
        self.entries, self.device_ids = entries, device_ids
        if entries is None:
            self.allocator = TokenAllocator(num_slots)
            self.cache = RadixCache(self.allocator)
        else:
            self.allocator = EntryTokenAllocator(num_slots, entries)
            self.cache = EntryRadixCache(self.allocator)
        self._writebacks: list[tuple[np.ndarray, np.ndarray]] = []  # (device, host)
        self._loads: list[tuple[np.ndarray, np.ndarray]] = []  # (host, device)
        # by rate, entry ids: (device, host) write-backs, (host, device) loads
        self._entry_writebacks: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._entry_loads: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._pinned: list[TreeNode] = []  # host nodes locked until `take_orders`
        self._unswapped: list[np.ndarray] = []  # swapped slots freed by `take_orders`
        self.swapped = 0  # host slots held by swapped-out requests
        self.hit_tokens = 0
        self.writeback_tokens = 0
        self.load_tokens = 0

    # ------------------------------------------------------------------ device -> host
    def write_back(self, key: np.ndarray, dev_slots: np.ndarray, space: Space = None) -> None:
        """Keep a copy of the KV of `key` (`dev_slots[i]` holds `key[i]`) in `space`, which
        the device tree is about to drop: order copies of the positions the host lacks."""
        held, node = self.cache.match_prefix(key, space)
        missing = len(key) - len(held)
        if missing == 0:
            return  # already on the host (a node loaded back earlier): now the freshest
        self.cache.inc_lock(node)  # the prefix we extend must survive making room
        needs = None if self.entries is None else self.entries.span(len(held), missing)
        host = take(self.allocator, self.cache, missing, self.entries, needs)
        self.cache.dec_lock(node)
        if host is None:
            return  # larger than everything the host can free: not kept
        self._write(dev_slots[len(held):], host, len(held))
        self.writeback_tokens += missing
        dup = self.cache.insert(key, np.concatenate([held, host]), space)
        assert dup == len(held), (dup, len(held))

    # ------------------------------------------------------------------ host -> device
    def match(self, key: np.ndarray, skip: int, space: Space = None) -> np.ndarray:
        """Host slots of `key[skip:n]`, where `key[:n]` is the longest prefix of `space` on
        the host (empty if n <= skip). They stay locked until `take_orders`."""
        held, node = self.cache.match_prefix(key, space)
        if len(held) <= skip:
            return _NONE
        self.cache.inc_lock(node)
        self._pinned.append(node)
        return held[skip:]

    def load(self, host_slots: np.ndarray, dev_slots: np.ndarray, start: int = 0) -> None:
        """Order a copy of `host_slots` into the fresh `dev_slots` (a prefix hit's
        positions from `start` on; with entries, the device slots hold their ids)."""
        self._loads.append((host_slots, dev_slots))
        if self.entries is not None:
            closing = np.arange(start, start + len(host_slots)) + 1
            for m in self.entries.rates:
                at = np.flatnonzero(closing % m == 0)
                if at.size:
                    pair = (self.entries.of_slot[m][host_slots[at]],
                            self.device_ids(m, dev_slots[at]))
                    self._entry_loads.setdefault(m, []).append(pair)
        self.hit_tokens += len(host_slots)
        self.load_tokens += len(host_slots)

    # ------------------------------------------------------------------ swapping
    def swap_out(self, dev_slots: np.ndarray) -> np.ndarray | None:
        """Host slots holding a copy of `dev_slots` (ordered now), held by the caller
        until `release`; None if the host cannot make room (least recently used cached
        prefixes are evicted for it)."""
        n = len(dev_slots)
        needs = None if self.entries is None else self.entries.span(0, n)
        host = take(self.allocator, self.cache, n, self.entries, needs)
        if host is None:
            return None
        self._write(np.asarray(dev_slots, dtype=np.int32), host, 0)
        self.writeback_tokens += n
        self.swapped += n
        return host

    def _write(self, dev_slots: np.ndarray, host_slots: np.ndarray, start: int) -> None:
        """Order copies of `dev_slots` (positions from `start` on) into `host_slots`, and
        with entries, host ids for the slots closing windows and copies of their entries."""
        self._writebacks.append((dev_slots, host_slots))
        if self.entries is not None:
            positions = np.arange(start, start + len(host_slots))
            for m, at, host_ids in self.entries.assign(host_slots, positions):
                pair = (self.device_ids(m, dev_slots[at]), host_ids)
                self._entry_writebacks.setdefault(m, []).append(pair)

    def release(self, host_slots: np.ndarray) -> None:
        """Give back swapped-out slots (after `load`ing what is needed of them): free once
        the plan carrying this step's orders is built."""
        self._unswapped.append(host_slots)

    # ------------------------------------------------------------------ orders
    def take_orders(self) -> CopyOrders | None:
        """The copies ordered since the last call (None: none), for the next plan; the
        host slots they read are no longer pinned."""
        for node in self._pinned:
            self.cache.dec_lock(node)
        self._pinned.clear()
        for slots in self._unswapped:
            self.allocator.free(slots)
            self.swapped -= len(slots)
        self._unswapped.clear()
        if not self._writebacks and not self._loads:
            return None
        wb, ld = self._writebacks, self._loads
        self._writebacks, self._loads = [], []
        wb_dev, wb_host = _cat(wb)
        ld_host, ld_dev = _cat(ld)
        entry_wb = {m: _last_into_each(*_cat(p)) for m, p in self._entry_writebacks.items()}
        entry_ld = {m: _last_into_each(*_cat(p)) for m, p in self._entry_loads.items()}
        self._entry_writebacks, self._entry_loads = {}, {}
        return CopyOrders(*_last_into_each(wb_dev, wb_host), *_last_into_each(ld_host, ld_dev),
                          entry_wb, entry_ld)

    def stats(self) -> HostStats:
        return HostStats(total=self.allocator.total,
                         used=self.allocator.total - self.allocator.available,
                         hit_tokens=self.hit_tokens, writeback_tokens=self.writeback_tokens,
                         load_tokens=self.load_tokens,
                         writeback_bytes=self.writeback_tokens * self.bytes_per_token,
                         load_bytes=self.load_tokens * self.bytes_per_token)

    def check_invariants(self) -> None:
        """Every host slot is free, cached in the host tree or held swapped, never two (and
        every host entry id held by one of its slots)."""
        self.cache.check_invariants(self.swapped)
        if self.entries is not None:
            self.entries.check(self.allocator, self.cache)


def _cat(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not pairs:
        return _NONE, _NONE
    return (np.concatenate([a for a, _ in pairs]).astype(np.int32),
            np.concatenate([b for _, b in pairs]).astype(np.int32))


def _last_into_each(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The orders `src[i] -> dst[i]` less those a later order into the same slot overrides.
    A slot written back, evicted and taken again within one step is ordered twice; one
    launch copies in no particular order, so only the last order may reach it."""
    _, last = np.unique(dst[::-1], return_index=True)  # first in reverse: last in order
    if len(last) == len(dst):
        return src, dst
    keep = np.sort(len(dst) - 1 - last)
    return src[keep], dst[keep]

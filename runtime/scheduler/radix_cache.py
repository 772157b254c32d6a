"""`RadixCache`: prefix cache over token-id sequences whose values are KV slot ids.

A radix tree (SGLang RadixAttention): each edge holds a run of token ids and the slots
holding their KV. Requests lock the path of the prefix they reuse; unlocked leaves are
evicted least-recently-used first when the allocator runs short.

Slot ownership: a slot is in exactly one place at a time: the allocator's free list, this
tree (evictable if its node is unlocked, protected if locked), or a request that computed
it and has not given it to the tree yet ("in use").

Keys live in spaces: the same tokens computed under another LoRA adapter (or none) have
other KV, so each space (an adapter's name; None: the base model) has a root of its own.
Eviction is one LRU order over all of them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from runtime.scheduler.token_allocator import TokenAllocator

_EMPTY = np.zeros(0, dtype=np.int32)
Space = str | None  # a key space: a LoRA adapter's name, or None for the base model


class TreeNode:
    """One edge of the tree: `key` token ids and the `value` slots holding their KV."""

    __slots__ = ("key", "value", "parent", "children", "lock_ref", "last_access", "uid")

    def __init__(
        self, key: np.ndarray, value: np.ndarray, parent: TreeNode | None, uid: int
    ) -> None:
        self.key = key  # [n] int32 token ids; empty only in a space's root
        self.value = value  # [n] int32 slot ids
        self.parent = parent  # None for the root and for evicted (detached) nodes
        self.children: dict[int, TreeNode] = {}  # first token of the child's key -> child
        self.lock_ref = 0  # requests whose locked path runs through this node
        self.last_access = 0  # logical clock tick of the last match/insert through it
        self.uid = uid  # creation order: a stable tie-break in the eviction heap


def _common_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    mismatch = np.flatnonzero(a[:n] != b[:n])
    return int(mismatch[0]) if mismatch.size else n


class RadixCache:
    """Radix tree of cached KV, sharing `allocator` with the requests that use it.

    `on_evict(key, slots, space)`, when set, sees each node `evict` drops just before its
    slots are freed: the token ids of the whole path from its space's root to it and their
    slots (the ancestors' still cached), so a lower tier can keep a copy.
    """

    def __init__(
        self,
        allocator: TokenAllocator,
        on_evict: Callable[[np.ndarray, np.ndarray, Space], None] | None = None,
    ) -> None:
        self.allocator = allocator
        self.on_evict = on_evict
        self._uids = itertools.count()
        self._clock = 0
        self._reset_tree()

    def _reset_tree(self) -> None:
        self._roots: dict[Space, TreeNode] = {}
        self._space_of: dict[int, Space] = {}  # id of a root -> its space
        self._evictable = 0
        self._protected = 0
        self._leaves: set[TreeNode] = set()  # nodes without children, root excluded

    # ------------------------------------------------------------------ sizes
    @property
    def evictable_size(self) -> int:
        """Cached tokens in unlocked nodes: `evict` can give these back to the allocator."""
        return self._evictable

    @property
    def protected_size(self) -> int:
        """Cached tokens in nodes locked by at least one request."""
        return self._protected

    @property
    def total_cached(self) -> int:
        return self._evictable + self._protected

    def _root_of(self, space: Space) -> TreeNode:
        root = self._roots.get(space)
        if root is None:
            root = self._roots[space] = TreeNode(_EMPTY, _EMPTY, None, next(self._uids))
            self._space_of[id(root)] = space
        return root

    # ------------------------------------------------------------------ lookup
    def match_prefix(self, key: Sequence[int] | np.ndarray,
                     space: Space = None) -> tuple[np.ndarray, TreeNode]:
        """Longest cached prefix of `key` in `space`: its slots (int32, the tree's own:
        borrow, never free) and the node ending exactly there (the space's root if nothing
        matched).

        An edge the match ends inside is split so the returned node covers the prefix
        exactly. Every node on the path becomes the most recently used.
        """
        key = np.asarray(key, dtype=np.int32)
        node, _, values = self._walk(key, space)
        return (np.concatenate(values) if values else _EMPTY.copy()), node

    def _walk(self, key: np.ndarray, space: Space) -> tuple[TreeNode, int, list[np.ndarray]]:
        """Descend along `key`, splitting the last edge if the match ends inside it."""
        self._clock += 1
        node, matched, values = self._root_of(space), 0, []
        while matched < len(key):
            child = node.children.get(int(key[matched]))
            if child is None:
                break
            common = _common_len(child.key, key[matched:])
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = self._clock
            values.append(child.value)
            matched += common
            node = child
        return node, matched, values

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Cut `node`'s edge after `at` tokens; returns the new upper half (same lock)."""
        upper = TreeNode(node.key[:at], node.value[:at], node.parent, next(self._uids))
        upper.lock_ref, upper.last_access = node.lock_ref, node.last_access
        upper.children[int(node.key[at])] = node
        node.parent.children[int(node.key[0])] = upper
        node.key, node.value, node.parent = node.key[at:], node.value[at:], upper
        return upper

    # ------------------------------------------------------------------ locks
    def inc_lock(self, node: TreeNode) -> None:
        """Protect `node` and its ancestors from eviction (one lock per call; a root is a
        no-op). Tokens of nodes going from 0 to 1 locks move evictable -> protected."""
        self._check_attached(node)
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock(self, node: TreeNode) -> None:
        """Undo one `inc_lock(node)`; nodes reaching 0 locks move protected -> evictable."""
        self._check_attached(node)
        while node.parent is not None:
            if node.lock_ref == 0:
                raise ValueError("dec_lock on a node that is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
            node = node.parent

    def _check_attached(self, node: TreeNode) -> None:
        if node.parent is None and len(node.key):  # neither attached nor a root
            raise ValueError("node was evicted or flushed from the tree")

    # ------------------------------------------------------------------ insert
    def insert(self, key: Sequence[int] | np.ndarray, slots: np.ndarray,
               space: Space = None) -> int:
        """Cache `slots` (`slots[i]` holds the KV of `key[i]`) in `space`; returns `dup`, the
        number of leading tokens that were already cached there.

        Ownership contract: the tree keeps its existing slots for `key[:dup]` and takes
        ownership of `slots[dup:]` (the caller must not free them). `slots[:dup]` stay
        the caller's: where a slot there is the tree's own (borrowed via `match_prefix`)
        the caller does nothing; its own copies (typically `slots[cached_len:dup]`) are
        duplicates the caller must free. The new nodes are unlocked (evictable).
        """
        key = np.asarray(key, dtype=np.int32)
        slots = np.asarray(slots, dtype=np.int32)
        if len(key) != len(slots):
            raise ValueError(f"insert of {len(key)} tokens with {len(slots)} slots")
        node, dup, _ = self._walk(key, space)
        if dup < len(key):
            leaf = TreeNode(key[dup:].copy(), slots[dup:].copy(), node, next(self._uids))
            leaf.last_access = self._clock
            node.children[int(key[dup])] = leaf
            self._leaves.discard(node)
            self._leaves.add(leaf)
            self._evictable += len(leaf.key)
        return dup

    # ------------------------------------------------------------------ evict
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` cached tokens if possible, least recently used unlocked
        leaves first (a parent whose last child goes becomes a candidate). Their slots go
        back to the allocator. Returns the number of tokens freed (whole nodes, so it can
        exceed `num_tokens`; less only when nothing evictable is left)."""
        heap = [(n.last_access, n.uid, n) for n in self._leaves if n.lock_ref == 0]
        heapq.heapify(heap)
        freed, released = 0, []
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            if self.on_evict is not None:
                self.on_evict(*self._path(node))
            parent = node.parent
            del parent.children[int(node.key[0])]
            node.parent = None
            self._leaves.discard(node)
            released.append(node.value)
            freed += len(node.key)
            self._evictable -= len(node.key)
            if parent.parent is not None and not parent.children:
                self._leaves.add(parent)
                if parent.lock_ref == 0:
                    heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        if released:
            self.allocator.free(np.concatenate(released))
        return freed

    def _path(self, node: TreeNode) -> tuple[np.ndarray, np.ndarray, Space]:
        """(token ids, slots) of every position from its space's root to the end of
        `node`, and that space."""
        keys, values = [], []
        while node.parent is not None:
            keys.append(node.key)
            values.append(node.value)
            node = node.parent
        return np.concatenate(keys[::-1]), np.concatenate(values[::-1]), self._space_of[id(node)]

    def reset(self) -> None:
        """Flush the whole tree, giving every cached slot back to the allocator. Only legal
        when no request holds a lock; the hit/query counters are kept (they are lifetime
        totals)."""
        if self._protected:
            raise RuntimeError(f"reset with {self._protected} tokens locked by requests")
        values = [_EMPTY]
        for node in self.nodes():
            values.append(node.value)
            node.parent = None  # detach, so stale handles are refused by inc_lock
        self.allocator.free(np.concatenate(values))
        self._reset_tree()

    def nodes(self) -> Iterator[TreeNode]:
        """Every cached node of every space (the roots not), parents before children."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            yield (node := stack.pop())
            stack.extend(node.children.values())

    # ------------------------------------------------------------------ checks
    def check_invariants(self, in_use: int) -> None:
        """Assert the tree's bookkeeping and `free + evictable + protected + in_use == total`,
        where `in_use` counts slots held by requests and not in the tree. Also asserts no
        slot is cached twice or is both cached and free. Raises AssertionError."""
        evictable = protected = 0
        values, leaves = [], set()
        for node in self.nodes():
            parent = node.parent
            assert len(node.key) == len(node.value) > 0, (
                f"node {node.uid}: {len(node.key)} tokens, {len(node.value)} slots"
            )
            assert parent is not None and parent.children.get(int(node.key[0])) is node, (
                f"node {node.uid} is not linked from its parent under its first token"
            )
            assert parent.parent is None or parent.lock_ref >= node.lock_ref >= 0, (
                f"node {node.uid} has {node.lock_ref} locks, parent {parent.lock_ref}"
            )
            locked = len(node.key) if node.lock_ref else 0
            protected, evictable = protected + locked, evictable + len(node.key) - locked
            if not node.children:
                leaves.add(node)
            values.append(node.value)
        assert evictable == self._evictable, (
            f"evictable_size {self._evictable}, but unlocked nodes hold {evictable}"
        )
        assert protected == self._protected, (
            f"protected_size {self._protected}, but locked nodes hold {protected}"
        )
        assert leaves == self._leaves, (
            f"leaf set out of date: {len(self._leaves)} tracked, {len(leaves)} in the tree"
        )
        cached = np.concatenate(values) if values else _EMPTY
        unique = np.unique(cached)
        assert unique.size == cached.size, f"{cached.size - unique.size} slots cached twice"
        assert cached.size == 0 or (cached.min() >= 1 and cached.max() <= self.allocator.total), (
            "tree holds a slot outside 1..total (slot 0 is the padding sink)"
        )
        free_cached = ~self.allocator.is_allocated(cached)
        assert not free_cached.any(), (
            f"{int(free_cached.sum())} cached slots are also on the free list, "
            f"e.g. {int(cached[free_cached][0])}"
        )
        alloc = self.allocator
        assert alloc.available + evictable + protected + in_use == alloc.total, (
            f"slot accounting: free {alloc.available} + evictable {evictable} + protected "
            f"{protected} + in use {in_use} = "
            f"{alloc.available + evictable + protected + in_use} != total {alloc.total}"
        )

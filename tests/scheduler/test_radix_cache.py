"""RadixCache: matching, splitting, insert ownership, locking, LRU eviction, and a
seeded randomized run checked against a model of which prefixes are cached."""

import random

import numpy as np
import pytest

from runtime.scheduler.radix_cache import RadixCache
from runtime.scheduler.token_allocator import TokenAllocator


def make(num_slots: int = 64) -> tuple[TokenAllocator, RadixCache]:
    alloc = TokenAllocator(num_slots)
    return alloc, RadixCache(alloc)


def cache_seq(alloc: TokenAllocator, cache: RadixCache, key: list[int]) -> np.ndarray:
    """Compute `key` from scratch (fresh slots) and cache it, freeing duplicates."""
    slots = alloc.alloc(len(key))
    dup = cache.insert(key, slots)
    alloc.free(slots[:dup])
    return slots


def matched(cache: RadixCache, key: list[int]) -> int:
    return len(cache.match_prefix(key)[0])


def test_match_after_insert():
    alloc, cache = make()
    slots = cache_seq(alloc, cache, [1, 2, 3, 4])
    got, node = cache.match_prefix([1, 2, 3, 4, 5])
    assert got.tolist() == slots.tolist()
    assert got.dtype == np.int32
    assert matched(cache, [2, 3]) == 0
    empty, root = cache.match_prefix([])
    assert len(empty) == 0
    assert cache.total_cached == cache.evictable_size == 4
    cache.check_invariants(in_use=0)


def test_split_in_the_middle_of_an_edge():
    alloc, cache = make()
    slots = cache_seq(alloc, cache, [1, 2, 3, 4, 5])
    got, node = cache.match_prefix([1, 2, 3, 9])
    assert got.tolist() == slots[:3].tolist()
    cache.inc_lock(node)  # the node ends exactly after 3 tokens: only they get protected
    assert (cache.protected_size, cache.evictable_size) == (3, 2)
    cache.check_invariants(in_use=0)
    other = alloc.alloc(5)
    assert cache.insert([1, 2, 3, 7, 8], other) == 3
    alloc.free(other[:3])
    assert (
        cache.match_prefix([1, 2, 3, 7, 8])[0].tolist() == slots[:3].tolist() + other[3:].tolist()
    )
    assert cache.match_prefix([1, 2, 3, 4, 5])[0].tolist() == slots.tolist()
    cache.check_invariants(in_use=0)
    cache.dec_lock(node)
    assert (cache.protected_size, cache.evictable_size) == (0, 7)


def test_insert_returns_duplicate_count_and_keeps_tree_slots():
    alloc, cache = make()
    a = alloc.alloc(6)
    assert cache.insert([1, 2, 3, 4, 5, 6], a) == 0
    # a second request computed an overlapping sequence without a cache hit
    b = alloc.alloc(6)
    dup = cache.insert([1, 2, 3, 4, 9, 9], b)
    assert dup == 4
    cache.check_invariants(in_use=len(b[:dup]))  # b[:4] are still the caller's
    alloc.free(b[:dup])
    cache.check_invariants(in_use=0)
    assert cache.match_prefix([1, 2, 3, 4, 9, 9])[0].tolist() == a[:4].tolist() + b[4:].tolist()
    assert cache.insert([1, 2, 3], alloc.alloc(3)) == 3  # fully cached already
    with pytest.raises(ValueError):
        cache.insert([1, 2], np.array([5], dtype=np.int32))


def test_request_lifecycle_with_borrowed_prefix():
    alloc, cache = make()
    cache_seq(alloc, cache, [1, 2, 3])
    prefix, node = cache.match_prefix([1, 2, 3, 4, 5])
    cache.inc_lock(node)
    own = alloc.alloc(2)
    cache.check_invariants(in_use=2)
    dup = cache.insert([1, 2, 3, 4, 5], np.concatenate([prefix, own]))
    assert dup == 3  # only the borrowed prefix: nothing of ours to free
    cache.dec_lock(node)
    cache.check_invariants(in_use=0)
    assert cache.total_cached == 5


def test_locked_nodes_survive_evict():
    alloc, cache = make(32)
    keep = cache_seq(alloc, cache, [1, 2, 3])
    cache_seq(alloc, cache, [7, 8])
    _, node = cache.match_prefix([1, 2, 3])
    cache.inc_lock(node)
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3])[0].tolist() == keep.tolist()
    assert (cache.evictable_size, cache.protected_size) == (0, 3)
    assert alloc.available == 29
    cache.check_invariants(in_use=0)
    cache.dec_lock(node)
    assert cache.evict(1) == 3
    assert alloc.available == alloc.total
    with pytest.raises(ValueError):
        cache.dec_lock(node)  # evicted: the handle is stale


def test_shared_locks_count_per_request():
    alloc, cache = make()
    cache_seq(alloc, cache, [1, 2, 3, 4])
    _, n1 = cache.match_prefix([1, 2, 3, 4])
    _, n2 = cache.match_prefix([1, 2])
    cache.inc_lock(n1)
    cache.inc_lock(n2)
    cache.dec_lock(n1)
    assert (cache.protected_size, cache.evictable_size) == (2, 2)
    assert cache.evict(10) == 2
    cache.dec_lock(n2)
    with pytest.raises(ValueError):
        cache.dec_lock(n2)
    cache.check_invariants(in_use=0)


def test_lru_order_of_eviction():
    alloc, cache = make()
    cache_seq(alloc, cache, [1, 1, 1])
    cache_seq(alloc, cache, [2, 2, 2])
    cache_seq(alloc, cache, [3, 3, 3])
    cache.match_prefix([1, 1, 1, 5])  # touching [1, 1, 1] makes it the newest
    assert cache.evict(3) == 3  # [2, 2, 2], the oldest
    assert cache.evict(1) == 3  # whole leaves: [3, 3, 3] is older than [1, 1, 1]
    assert cache.total_cached == 3 and matched(cache, [1, 1, 1]) == 3
    cache.check_invariants(in_use=0)


def test_lru_is_per_token_run():
    alloc, cache = make()
    cache_seq(alloc, cache, [1, 1, 1, 1])
    cache_seq(alloc, cache, [2, 2])
    cache.match_prefix([1, 1])  # splits [1, 1 | 1, 1]; only the head is used
    assert cache.evict(1) == 2  # the unused tail [1, 1] is older than [2, 2]
    assert cache.match_prefix([1, 1, 1, 1])[0].size == 2
    assert matched(cache, [2, 2]) == 2


def test_parent_becomes_eviction_candidate():
    alloc, cache = make()
    cache_seq(alloc, cache, [1, 2, 3, 4])
    cache_seq(alloc, cache, [1, 2, 3, 5])  # splits: [1, 2, 3] -> {[4], [5]}
    cache_seq(alloc, cache, [9, 9])  # newest
    assert cache.evict(2) == 2  # both children of [1, 2, 3], older than [9, 9]
    assert (matched(cache, [1, 2, 3, 4]), matched(cache, [9, 9])) == (3, 2)
    cache.match_prefix([9, 9])
    assert cache.evict(1) == 3  # the orphaned parent is now the oldest leaf
    assert (matched(cache, [1, 2, 3]), matched(cache, [9, 9])) == (0, 2)
    cache.check_invariants(in_use=0)


def test_reset_refuses_while_locked_then_flushes():
    alloc, cache = make()
    cache_seq(alloc, cache, [1, 2, 3])
    cache_seq(alloc, cache, [4, 5])
    _, node = cache.match_prefix([1, 2])
    cache.inc_lock(node)
    with pytest.raises(RuntimeError):
        cache.reset()
    cache.dec_lock(node)
    cache.reset()
    assert alloc.available == alloc.total and cache.total_cached == 0
    assert matched(cache, [1, 2, 3]) == 0
    with pytest.raises(ValueError):
        cache.inc_lock(node)
    cache.check_invariants(in_use=0)


def test_check_invariants_catches_leaked_slots():
    alloc, cache = make()
    cache_seq(alloc, cache, [1, 2])
    alloc.alloc(3)
    with pytest.raises(AssertionError, match="slot accounting"):
        cache.check_invariants(in_use=0)


# ---------------------------------------------------------------- randomized, model-based
class ModelReq:
    def __init__(self, key, prefix, node, own):
        self.key, self.prefix, self.node, self.own = key, prefix, node, own

    @property
    def locked_len(self) -> int:
        return len(self.prefix)


def longest_cached(model: dict, key: tuple) -> int:
    n = 0
    while n < len(key) and key[: n + 1] in model:
        n += 1
    return n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_randomized_against_model(seed):
    rng = random.Random(seed)
    alloc, cache = make(400)
    model: dict[tuple, int] = {}  # every cached prefix -> slot of its last token
    sequences: set[tuple] = set()  # every key inserted (the tree holds only their prefixes)
    active: list[ModelReq] = []
    bases = [tuple(rng.randrange(4) for _ in range(rng.randint(4, 16))) for _ in range(5)]

    def new_key() -> tuple:
        base = rng.choice(bases)
        tail = tuple(rng.randrange(6) for _ in range(rng.randint(0, 12)))
        return base[: rng.randint(0, len(base))] + tail

    def check_match(key: tuple) -> tuple:
        slots, node = cache.match_prefix(key)
        n = longest_cached(model, key)
        assert len(slots) == n
        assert slots.tolist() == [model[key[: i + 1]] for i in range(n)]
        return slots, node

    def insert(key: tuple, slots: np.ndarray) -> int:
        expected = longest_cached(model, key)
        dup = cache.insert(key, slots)
        assert dup == expected
        for i in range(dup, len(key)):
            model[key[: i + 1]] = int(slots[i])
        sequences.add(key)
        return dup

    def evict(n: int) -> None:
        before = cache.evictable_size
        freed = cache.evict(n)
        assert freed >= n or freed == before
        assert cache.evictable_size == before - freed
        removed = 0
        for seq in list(sequences):  # reconcile the model with what survived
            n_left = len(cache.match_prefix(seq)[0])
            for i in range(n_left, len(seq)):
                removed += model.pop(seq[: i + 1], None) is not None
            if n_left == 0:
                sequences.discard(seq)
        assert removed == freed
        for req in active:  # locked prefixes are untouched
            assert cache.match_prefix(req.key[: req.locked_len])[0].tolist() == req.prefix.tolist()

    for _ in range(1500):
        op = rng.random()
        if op < 0.35 or not active:
            key = new_key()
            if not key:
                continue
            prefix, node = check_match(key)
            cache.inc_lock(node)
            need = len(key) - len(prefix)
            if alloc.available < need:
                evict(need - alloc.available)
            own = alloc.alloc(need)
            if own is None:
                cache.dec_lock(node)
                continue
            active.append(ModelReq(key, prefix, node, own))
        elif op < 0.65:
            req = active.pop(rng.randrange(len(active)))
            if rng.random() < 0.8:  # finished: cache it, free our duplicates
                dup = insert(req.key, np.concatenate([req.prefix, req.own]))
                assert dup >= req.locked_len
                alloc.free(req.own[: dup - req.locked_len])
            else:  # aborted
                alloc.free(req.own)
            cache.dec_lock(req.node)
        elif op < 0.8:  # chunked prefill: cache what is computed, relock the longer prefix
            req = rng.choice(active)
            dup = insert(req.key, np.concatenate([req.prefix, req.own]))
            alloc.free(req.own[: dup - req.locked_len])
            prefix, node = check_match(req.key)
            assert len(prefix) == len(req.key)
            cache.inc_lock(node)
            cache.dec_lock(req.node)
            req.prefix, req.node, req.own = prefix, node, req.own[:0]
        else:
            evict(rng.randint(1, 120))

        cache.check_invariants(in_use=sum(len(r.own) for r in active))
        locked = {r.key[:i] for r in active for i in range(1, r.locked_len + 1)}
        assert cache.protected_size == len(locked)
        assert cache.total_cached == len(model)

    while active:
        req = active.pop()
        alloc.free(req.own)
        cache.dec_lock(req.node)
    evict(alloc.total)
    assert model == {} and alloc.available == alloc.total
    cache.check_invariants(in_use=0)

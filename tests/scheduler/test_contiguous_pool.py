"""ContiguousPool: first fit, coalescing on release, fragmentation numbers."""

import random

import pytest

from runtime.scheduler.kv_study.contiguous_pool import ContiguousPool
from runtime.scheduler.row_pool import AllocatorError


def test_first_fit_and_exhaustion():
    pool = ContiguousPool(100)
    assert pool.reserve(30) == 1  # slot 0 is the padding sink
    assert pool.reserve(30) == 31
    assert pool.reserve(50) is None  # 40 left: no partial reservation
    assert pool.reserve(40) == 61
    assert pool.reserve(1) is None
    assert pool.available == 0 and pool.reserved == 100


def test_first_fit_takes_the_lowest_hole_that_fits():
    pool = ContiguousPool(100)
    a, b, c, d = (pool.reserve(n) for n in (10, 20, 10, 60))
    pool.release(a)  # hole [1, 11)
    pool.release(c)  # hole [31, 41)
    assert pool.reserve(15) is None  # no hole of 15 although 20 are free
    assert pool.reserve(8) == 1
    assert pool.reserve(10) == 31
    assert pool.reserve(2) == 9
    assert (b, d) == (11, 41)


def test_coalescing_on_release():
    pool = ContiguousPool(60)
    starts = [pool.reserve(10) for _ in range(6)]
    for i in (1, 3):
        pool.release(starts[i])
    assert pool.stats(0).num_free_regions == 2
    pool.release(starts[2])  # bridges both holes
    s = pool.stats(0)
    assert (s.num_free_regions, s.largest_free_region) == (1, 30)
    assert pool.reserve(30) == starts[1]
    for i in (0, 1, 4, 5):
        pool.release(starts[i])
    assert pool.stats(0).num_free_regions == 1
    assert pool.reserve(60) == 1
    with pytest.raises(AllocatorError):
        pool.release(starts[2])  # inside a region, not its start
    pool.release(1)
    with pytest.raises(AllocatorError):
        pool.release(1)


def test_fragmentation_numbers():
    pool = ContiguousPool(100)
    a = pool.reserve(40)  # [1, 41)
    pool.reserve(20)  # [41, 61)
    c = pool.reserve(10)  # [61, 71)
    pool.release(a)
    pool.release(c)
    # reserved 20 (live 5); free: [1, 41) = 40 and [61, 101) = 40
    s = pool.stats(live_tokens=5)
    assert (s.total, s.reserved, s.live, s.free) == (100, 20, 5, 80)
    assert (s.largest_free_region, s.num_free_regions) == (40, 2)
    assert s.usage == pytest.approx(0.2)
    assert s.internal_fragmentation == pytest.approx(0.75)
    assert s.external_fragmentation == pytest.approx(0.5)
    assert pool.reserve(41) is None  # 80 free, but no region of 41
    with pytest.raises(ValueError):
        pool.stats(live_tokens=21)


def test_randomized_regions_never_overlap():
    rng = random.Random(0)
    pool = ContiguousPool(500)
    live: dict[int, int] = {}
    for _ in range(2000):
        if live and rng.random() < 0.5:
            start = rng.choice(list(live))
            del live[start]
            pool.release(start)
        else:
            n = rng.randint(1, 80)
            start = pool.reserve(n)
            if start is not None:
                live[start] = n
        taken = sorted(live.items())
        assert all(s + n <= nxt for (s, n), (nxt, _) in zip(taken, taken[1:]))
        assert all(s >= 1 and s + n - 1 <= 500 for s, n in taken)
        assert pool.reserved == sum(live.values())

"""TokenAllocator and RowPool: round trips, exhaustion, and misuse detection."""

import numpy as np
import pytest

from runtime.scheduler.row_pool import AllocatorError, RowPool
from runtime.scheduler.token_allocator import TokenAllocator


def test_alloc_free_round_trip():
    alloc = TokenAllocator(10)
    assert (alloc.total, alloc.available) == (10, 10)
    a = alloc.alloc(4)
    b = alloc.alloc(6)
    assert a.dtype == np.int32
    assert sorted(np.concatenate([a, b]).tolist()) == list(range(1, 11))  # never slot 0
    assert alloc.available == 0
    alloc.free(a)
    alloc.free(b.tolist())
    assert alloc.available == 10
    again = alloc.alloc(10)
    assert sorted(again.tolist()) == list(range(1, 11))


def test_exhaustion_returns_none_and_takes_nothing():
    alloc = TokenAllocator(8)
    held = alloc.alloc(5)
    assert alloc.alloc(4) is None
    assert alloc.available == 3
    assert len(alloc.alloc(3)) == 3
    assert alloc.alloc(1) is None
    assert len(alloc.alloc(0)) == 0
    alloc.free(held)
    assert alloc.available == 5


def test_freed_slots_are_reused_last():
    alloc = TokenAllocator(6)
    first = alloc.alloc(2)
    alloc.free(first)
    # FIFO: the never-used slots come before the ones just freed
    assert alloc.alloc(4).tolist() == [3, 4, 5, 6]
    assert sorted(alloc.alloc(2).tolist()) == sorted(first.tolist())


@pytest.mark.parametrize("bad", [[0], [11], [-1]])
def test_free_out_of_range_raises(bad):
    alloc = TokenAllocator(10)
    alloc.alloc(10)
    with pytest.raises(AllocatorError):
        alloc.free(bad)
    assert alloc.available == 0


def test_double_free_raises_and_frees_nothing():
    alloc = TokenAllocator(10)
    slots = alloc.alloc(3)
    alloc.free(slots[:1])
    with pytest.raises(AllocatorError, match="double free"):
        alloc.free(slots)  # slots[0] already free
    assert alloc.available == 8
    with pytest.raises(AllocatorError, match="twice in one call"):
        alloc.free([slots[1], slots[2], slots[1]])
    assert alloc.available == 8
    alloc.free(slots[1:])
    assert alloc.available == 10


def test_never_allocated_slot_raises():
    alloc = TokenAllocator(10)
    with pytest.raises(AllocatorError):
        alloc.free([5])


def test_randomized_against_a_set():
    rng = np.random.default_rng(0)
    alloc = TokenAllocator(5000)
    held: list[np.ndarray] = []
    for _ in range(500):
        if held and rng.random() < 0.45:
            alloc.free(held.pop(int(rng.integers(len(held)))))
        else:
            got = alloc.alloc(int(rng.integers(1, 400)))
            if got is not None:
                held.append(got)
        live = np.concatenate(held) if held else np.zeros(0, np.int32)
        assert len(np.unique(live)) == len(live)
        assert alloc.available + len(live) == alloc.total
        assert alloc.is_allocated(live).all()


def test_row_pool():
    rows = RowPool(3)
    got = [rows.alloc() for _ in range(3)]
    assert sorted(got) == [0, 1, 2]
    assert rows.alloc() is None
    rows.free(got[1])
    with pytest.raises(AllocatorError):
        rows.free(got[1])
    with pytest.raises(AllocatorError):
        rows.free(3)
    assert rows.alloc() == got[1]
    assert rows.available == 0 and rows.total == 3

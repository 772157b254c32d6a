"""`--block-size dynamic`: size classes by request length over 64-slot superblocks."""

from __future__ import annotations

import random

import numpy as np
import pytest

from runtime.scheduler.kv_study.dynamic_kv import DynamicPagedKV, block_size_for, block_slots
from runtime.scheduler.kv_study.superblock_pool import SuperblockPool
from runtime.scheduler.req import Req
from runtime.scheduler.row_pool import AllocatorError
from tests.scheduler.fake_worker import make_req, reference
from tests.scheduler.kv_modes import build_mode, grow, no_eos
from tests.scheduler.test_scheduler import check_against_reference, random_reqs, run_all


def test_size_classes_by_maximum_length():
    assert [block_size_for(n) for n in (1, 511, 512, 2047, 2048, 9000)] == [16, 16, 32, 32, 64, 64]


def test_superblocks_split_per_class_and_merge_back():
    pool = SuperblockPool(64 * 4 - 1)  # superblocks 1..3 usable
    assert pool.total == 192 and pool.capacity(16) == 12
    small = pool.allocate(16, 5)  # one superblock split in 4, a second for the fifth
    assert small[:4] == [64, 80, 96, 112] and pool.num_free_superblocks == 1
    assert pool.stranded == 48  # 3 free 16-blocks usable only by the 16 class
    assert pool.allocate(32, 3) is None and pool.capacity(32) == 2
    mid = pool.allocate(32, 2)
    assert mid == [192, 224] and pool.num_free_superblocks == 0
    assert pool.allocate(64, 1) is None
    pool.free(small[:4])  # its superblock drains and is whole again
    assert pool.num_free_superblocks == 1 and pool.allocate(64, 1) == [64]
    with pytest.raises(AllocatorError):
        pool.free(small[1:2])  # freed with its superblock
    pool.check_invariants()
    assert pool.reserved == 16 + 64 + 64


def test_randomized_superblock_accounting():
    rng = random.Random(0)
    pool = SuperblockPool(64 * 20 - 1)
    held: list[tuple[int, int]] = []
    for _ in range(3000):
        if held and rng.random() < 0.5:
            start, size = held.pop(rng.randrange(len(held)))
            pool.free([start])
        else:
            size = rng.choice((16, 32, 64))
            got = pool.allocate(size, rng.randint(1, 3))
            held += [(s, size) for s in got or []]
        assert pool.reserved == sum(size for _, size in held)
        assert len({s for s, _ in held}) == len(held)
        pool.check_invariants()


def test_decode_needs_a_superblock_only_when_a_class_runs_out():
    kv = DynamicPagedKV(num_slots=64 * 4 - 1, num_rows=8)  # 3 usable superblocks
    reqs = [Req(make_req(f"r{i}", [1] * 16, 10)) for i in range(5)]  # class 16
    for req in reqs:
        assert kv.admit(req)
        grow(kv, req, 16)
    # 5 blocks of 16 held: 3 free in the second superblock, 1 superblock whole
    assert kv.stats().free == 64 and kv.pool.num_free_blocks(16) == 3
    assert kv.can_decode(reqs[:3], spare=64)  # the split superblock's free blocks
    assert kv.can_decode(reqs) and not kv.can_decode(reqs, spare=1)  # splits the last one
    assert kv.room(reqs[0]) == 16 * (3 + 4)
    stats = kv.stats()
    assert (stats.live, stats.reserved, stats.used) == (80, 80, 128)  # 48 stranded
    kv.check_invariants(reqs)


def test_block_slots_map_positions_through_the_table():
    starts = [40, 8, 96]
    np.testing.assert_array_equal(block_slots(starts, 8, 5, 7), [45, 46, 47, 8, 9, 10, 11])
    np.testing.assert_array_equal(block_slots(starts, 8, 16, 2), [96, 97])
    assert block_slots(starts, 8, 0, 0).size == 0


@pytest.mark.parametrize("overlap", [True, False])
def test_mixed_classes_match_reference(overlap):
    sched, worker = build_mode(
        "paged",
        block_size="dynamic",
        max_context=4096,
        chunk_size=256,
        num_slots=16384,
        overlap=overlap,
    )
    rng = random.Random(7)
    lengths = [(20, 30), (100, 12), (600, 20), (1500, 40), (2100, 10), (3000, 8)]
    reqs = [
        make_req(f"d{i}", [rng.randrange(1, 97) for _ in range(p)], m)
        for i, (p, m) in enumerate(lengths)
    ]
    check_against_reference(reqs, run_all(sched, worker, reqs))
    assert sched.kv.stats().used == 0 and not sched.kv.tables
    sched.kv.check_invariants([])


def test_classes_seen_by_the_scheduler():
    sched, _ = build_mode("paged", block_size="dynamic", max_context=4096, num_slots=16384)
    for rid, (p, m) in {"s": (10, 10), "m": (500, 100), "l": (2000, 100)}.items():
        sched.add(make_req(rid, [1] * p, m))
    sched.plan()
    assert {rid: t.size for rid, t in sched.kv.tables.items()} == {"s": 16, "m": 32, "l": 64}


@pytest.mark.parametrize("overlap", [True, False])
def test_tiny_pool_preempts_and_keeps_outputs(overlap):
    sched, worker = build_mode(
        "paged",
        block_size="dynamic",
        num_slots=64 * 4 - 1,
        chunk_size=64,
        overlap=overlap,
        schedule_conservativeness=0.0,
    )
    reqs = no_eos(random_reqs(12, seed=2, max_prompt=20), 50)
    outs = run_all(sched, worker, reqs)
    assert sched.num_retractions > 0
    for r in reqs:
        assert outs[r.rid]["ids"] == reference(r.input_ids, 50, set()), r.rid
    assert sched.kv.stats().used == 0

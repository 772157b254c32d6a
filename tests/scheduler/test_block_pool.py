"""BlockPool: hash chains, prefix hits through touch, LRU eviction order, accounting."""

import random

import pytest

from runtime.scheduler.block_pool import BlockPool, chain_block_hashes, hash_block_tokens
from runtime.scheduler.row_pool import AllocatorError

BS = 4


def run_request(pool: BlockPool, tokens: list[int]) -> tuple[list, list]:
    """Admit a request: reuse its cached prefix, allocate the rest, cache its full blocks."""
    hashes = chain_block_hashes(tokens, BS)
    hits = pool.match_prefix(hashes)
    pool.touch(hits)
    fresh = pool.allocate(-(-len(tokens) // BS) - len(hits))
    assert fresh is not None
    blocks = hits + fresh
    pool.cache_full_blocks(blocks, hashes, start=len(hits))
    pool.check_invariants()
    return blocks, hashes


def test_hash_chain_equal_for_identical_prefixes():
    a = chain_block_hashes(list(range(10)), BS)
    b = chain_block_hashes(list(range(8)) + [99, 98, 97, 96], BS)
    assert len(a) == 2 and len(b) == 3  # full blocks only
    assert a == b[:2]
    assert chain_block_hashes([5, 1, 2, 3, 4, 5, 6, 7], BS)[1] != a[1]  # parent differs
    assert hash_block_tokens(None, [1, 2, 3, 4]) != hash_block_tokens(a[0], [1, 2, 3, 4])
    # extending a known chain gives the same hashes as hashing from scratch
    assert a + chain_block_hashes(list(range(12))[len(a) * BS :], BS, a) == chain_block_hashes(
        list(range(12)), BS
    )


def test_null_block_is_never_handed_out():
    pool = BlockPool(5, BS)
    blocks = pool.allocate(4)
    assert sorted(b.block_id for b in blocks) == [1, 2, 3, 4]
    assert pool.allocate(1) is None
    assert pool.usage == 1.0
    with pytest.raises(AllocatorError):
        pool.free([pool.null_block])


def test_allocate_is_all_or_nothing_and_double_free_raises():
    pool = BlockPool(6, BS)
    held = pool.allocate(3)
    assert pool.allocate(3) is None and pool.num_free_blocks == 2
    pool.free(held)
    with pytest.raises(AllocatorError):
        pool.free(held[:1])
    pool.check_invariants()


def test_cache_hit_after_free_reuses_block_via_touch():
    pool = BlockPool(10, BS)
    tokens = list(range(10))  # two full blocks + a partial one
    blocks, hashes = run_request(pool, tokens)
    assert pool.num_cached_blocks == 2
    pool.free(blocks)
    assert pool.num_free_blocks == 9 and pool.usage == 0.0

    again, _ = run_request(pool, tokens[:8] + [50, 51, 52])
    assert [b.block_id for b in again[:2]] == [b.block_id for b in blocks[:2]]
    assert again[0].ref_cnt == 1 and again[0].block_hash == hashes[0]
    # a concurrent sharer takes a second reference on the same blocks
    shared, _ = run_request(pool, tokens[:4])
    assert shared[0] is again[0] and again[0].ref_cnt == 2
    pool.free(shared)
    assert again[0].ref_cnt == 1
    pool.check_invariants()


def test_eviction_order_from_the_free_queue():
    pool = BlockPool(7, BS)  # 6 usable
    a, _ = run_request(pool, list(range(12)))  # 3 cached blocks
    b, _ = run_request(pool, list(range(100, 112)))
    pool.free(a)
    pool.free(b)
    order = [blk.block_id for blk in pool.free_queue]
    # a's blocks before b's, each request's tail first
    assert order == [
        a[2].block_id,
        a[1].block_id,
        a[0].block_id,
        b[2].block_id,
        b[1].block_id,
        b[0].block_id,
    ]
    got = pool.allocate(2)  # reuses a's last two blocks and drops their hashes
    assert [blk.block_id for blk in got] == order[:2]
    assert all(blk.block_hash is None for blk in got)
    hashes = chain_block_hashes(list(range(12)), BS)
    assert [blk is not None for blk in map(pool.get_cached_block, hashes)] == [True, False, False]
    assert len(pool.match_prefix(hashes)) == 1
    pool.check_invariants()


def test_duplicate_block_stays_uncached():
    pool = BlockPool(8, BS)
    tokens = [1, 2, 3, 4]
    hashes = chain_block_hashes(tokens, BS)
    first, second = pool.allocate(1), pool.allocate(1)  # computed concurrently
    pool.cache_full_blocks(first, hashes)
    pool.cache_full_blocks(second, hashes)
    assert pool.get_cached_block(hashes[0]) is first[0] and second[0].block_hash is None
    pool.free(second)
    pool.free(first)
    pool.check_invariants()


def test_randomized_no_block_double_counted():
    rng = random.Random(0)
    pool = BlockPool(40, BS)
    prefixes = [[rng.randrange(3) for _ in range(rng.randint(4, 20))] for _ in range(4)]
    live: list[list] = []
    hits = 0
    for _ in range(2000):
        if live and (rng.random() < 0.45 or pool.num_free_blocks < 6):
            pool.free(live.pop(rng.randrange(len(live))))
        else:
            tokens = rng.choice(prefixes) + [rng.randrange(3) for _ in range(rng.randint(0, 9))]
            if tokens:
                hits += len(pool.match_prefix(chain_block_hashes(tokens, BS)))
                live.append(run_request(pool, tokens)[0])
        held = sum(len(blocks) for blocks in live)
        refs = sum(blk.ref_cnt for blk in pool.blocks)
        assert refs == held
        assert pool.num_free_blocks == pool.num_usable_blocks - sum(
            blk.ref_cnt > 0 for blk in pool.blocks
        )
        pool.check_invariants()
    assert hits > 0

"""Paged KV (`--kv paged`): the token-hash fake worker gives the reference output under every
scheduling configuration; block tables, hash chains and ref counts stay consistent."""

from __future__ import annotations

import random

import pytest

from runtime.scheduler.block_pool import chain_block_hashes
from runtime.scheduler.paged_kv import PagedKV
from runtime.scheduler.req import Req
from tests.scheduler.fake_worker import drive, make_req, reference
from tests.scheduler.kv_modes import build_mode, grow, no_eos
from tests.scheduler.test_scheduler import check_against_reference, collect, random_reqs, run_all


def assert_all_free(sched) -> None:
    """Every block free (cached or not), no table left, pool consistent."""
    kv = sched.kv
    assert kv.stats().used == 0 and not kv.tables
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks)
    kv.check_invariants([])


def run_watching(sched, worker, reqs, watch) -> dict:
    """run_all, calling `watch(sched)` after every step."""
    outs: dict = {}
    collector = collect(sched, outs)

    def on_step(s, step):
        collector(s, step)
        watch(s)

    for r in reqs:
        sched.add(r)
    drive(sched, worker, on_step=on_step)
    return outs


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("block_size", [4, 16])
def test_outputs_match_reference_with_chunked_prefill(overlap, block_size):
    sched, worker = build_mode("paged", chunk_size=24, block_size=block_size, overlap=overlap)
    reqs = random_reqs(24, seed=1)
    check_against_reference(reqs, run_all(sched, worker, reqs))
    assert_all_free(sched)


@pytest.mark.parametrize("overlap", [True, False])
def test_prefix_hits_after_the_first_request_finishes(overlap):
    sched, worker = build_mode("paged", chunk_size=64, max_running=4, overlap=overlap)
    shared = [random.Random(3).randrange(1, 97) for _ in range(50)]  # 3 full blocks + 2
    first = random_reqs(1, seed=4, prefix=shared, max_prompt=10)
    first.append(make_req("aligned", shared[:48], 20))  # exactly 3 blocks
    check_against_reference(first, run_all(sched, worker, first))
    assert sched.kv.stats().prefix_hit_tokens == 0
    shared_refs = []
    reqs = [
        make_req(f"s{i}", r.input_ids, r.params.max_tokens)
        for i, r in enumerate(random_reqs(12, seed=5, prefix=shared, max_prompt=10))
    ]
    reqs.append(make_req("again", shared[:48], 20))  # hits 2 blocks: the last token is computed
    outs = run_watching(
        sched, worker, reqs, lambda s: shared_refs.append(max(b.ref_cnt for b in s.kv.pool.blocks))
    )
    check_against_reference(reqs, outs)
    assert sched.kv.stats().prefix_hit_tokens >= 12 * 48  # every request reused the 3 shared blocks
    assert max(shared_refs) >= 2  # concurrent requests held the same blocks
    assert_all_free(sched)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("block_size", [4, 16])
def test_tiny_pool_preempts_by_recompute_and_keeps_outputs(overlap, block_size):
    sched, worker = build_mode(
        "paged",
        num_slots=160,
        chunk_size=64,
        block_size=block_size,
        overlap=overlap,
        schedule_conservativeness=0.0,
    )
    reqs = no_eos(random_reqs(16, seed=2, max_prompt=20), 60)
    victims = []
    retract = sched._retract

    def record(req):
        victims.append((req, [r.arrival for r in sched.running]))
        retract(req)

    sched._retract = record
    outs = run_all(sched, worker, reqs)
    assert sched.num_retractions > 0
    for r in reqs:
        assert outs[r.rid]["ids"] == reference(r.input_ids, 60, set()), r.rid
        assert outs[r.rid]["reason"] == "length"
    # vLLM V1 order: the most recently arrived running request goes first
    assert all(req.arrival == max(arrivals) for req, arrivals in victims)
    # a re-admitted victim found its earlier full blocks still cached (unique prompts)
    assert sched.kv.stats().prefix_hit_tokens > 0
    assert_all_free(sched)


def test_admit_matches_full_blocks_and_leaves_a_token_to_compute():
    kv = PagedKV(num_slots=255, num_rows=4, block_size=4)
    a = Req(make_req("a", list(range(1, 9)), 5))  # exactly two full blocks
    assert kv.admit(a) and a.cached_len == 0
    pages_a = grow(kv, a, 8)
    grow(kv, a, 1)  # a later step: the first 8 positions are registered now
    assert kv.pool.num_cached_blocks == 2
    same = Req(make_req("same", list(range(1, 9)), 5))
    assert kv.admit(same) and same.cached_len == 4  # matched on 7 tokens: one full block
    longer = Req(make_req("longer", list(range(1, 9)) + [50], 5))
    assert kv.admit(longer) and longer.cached_len == 8
    assert longer.prefix_pages == pages_a.tolist()
    assert [b.ref_cnt for b in kv.tables["a"].blocks[:2]] == [3, 2]
    kv.check_invariants([a, same, longer])
    blocks_a = list(kv.tables["a"].blocks)
    for req in (longer, same, a):
        kv.release(req, cache=True)
    # a's blocks reach ref 0 last, tail first: the shared head block is evicted last
    assert list(kv.pool.free_queue)[-3:] == blocks_a[::-1]
    kv.check_invariants([])
    stats = kv.stats()
    assert stats.used == 0 and stats.cached == 8  # a's 2 full blocks stay cached
    # looked up 7, 7 and 8 tokens (one is always left to compute), found 0, 4 and 8
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (7 + 7 + 8, 4 + 8)


def test_release_without_cache_registers_nothing_new():
    kv = PagedKV(num_slots=127, num_rows=2, block_size=4)
    req = Req(make_req("x", list(range(1, 13)), 3))
    kv.admit(req)
    grow(kv, req, 12)
    kv.release(req, cache=False)  # a preemption: its blocks were never registered
    assert kv.pool.num_cached_blocks == 0
    req2 = Req(make_req("y", list(range(1, 13)), 3))
    kv.admit(req2)
    grow(kv, req2, 12)
    kv.release(req2, cache=True)
    assert kv.pool.num_cached_blocks == 3
    hashes = chain_block_hashes(list(range(1, 13)), 4)
    assert all(kv.pool.get_cached_block(h) is not None for h in hashes)


def test_decode_needs_a_block_only_at_a_block_boundary():
    kv = PagedKV(num_slots=11, num_rows=2, block_size=4)  # 2 usable blocks
    req = Req(make_req("x", [1, 2, 3, 4, 5, 6], 3))
    kv.admit(req)
    assert kv.can_admit(req, 8) and not kv.can_admit(req, 9)  # whole blocks
    grow(kv, req, 6)
    assert kv.stats().free == 0
    assert kv.can_decode([req]) and not kv.can_decode([req], spare=1)
    assert kv.room(req) == 2  # the rest of its last block
    grow(kv, req, 2)
    assert not kv.can_decode([req])  # a full last block: the next position needs a block
    stats = kv.stats()
    assert (stats.live, stats.reserved, stats.used) == (8, 8, 8)


def test_invariants_catch_wrong_refs_slots_and_hashes():
    kv = PagedKV(num_slots=127, num_rows=2, block_size=4)
    req = Req(make_req("x", list(range(1, 7)), 3))
    kv.admit(req)
    grow(kv, req, 6)
    kv.check_invariants([req])
    kv.tables["x"].blocks[0].ref_cnt += 1
    with pytest.raises(AssertionError):
        kv.check_invariants([req])
    kv.tables["x"].blocks[0].ref_cnt -= 1
    kv.tables["x"].num_tokens += 3  # past the blocks it holds
    with pytest.raises(AssertionError, match="2 blocks for 9 tokens"):
        kv.check_invariants([req])
    kv.tables["x"].num_tokens -= 3
    kv.tables["x"].hashes[0] = bytes(16)
    with pytest.raises(AssertionError, match="stale hash chain"):
        kv.check_invariants([req])
    with pytest.raises(AssertionError, match="live requests differ"):
        kv.check_invariants([])

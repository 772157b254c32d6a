"""LoRA in the scheduler: device slots (LRU, pinned by running requests, a wait when all
are pinned), the adapter slots and loads a plan carries, and prefix caches that never
share KV between adapters (radix tree spaces, block-hash seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.scheduler.block_pool import chain_block_hashes, space_seed
from runtime.scheduler.lora_slots import LoraSlots
from runtime.scheduler.radix_cache import RadixCache
from runtime.scheduler.req import Req
from runtime.scheduler.token_allocator import TokenAllocator
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from tests.scheduler.fake_worker import drive, make_req, reference
from tests.scheduler.kv_modes import build_mode

ADAPTERS = ("a=/adapters/a", "b=/adapters/b", "c=/adapters/c")


def req(rid: str, lora: str | None) -> Req:
    return Req(GenerateReq(rid, [1, 2, 3], SamplingParams(lora=lora)))


def test_slots_load_on_demand_and_evict_the_least_recently_used_unpinned():
    slots = LoraSlots(["a", "b", "c"], 2)
    ra, rb, rc, base = req("1", "a"), req("2", "b"), req("3", "c"), req("4", None)
    assert slots.acquire(base) and base.lora_slot is None  # the base needs no slot
    assert slots.acquire(ra) and slots.acquire(rb)
    assert slots.take_loads() == [(0, "a"), (1, "b")]
    assert not slots.acquire(rc)  # both slots pinned by running requests: c waits
    slots.release(ra)
    slots.release(rb)  # now b was used last
    assert slots.acquire(rc) and rc.lora_slot == 0  # evicts a, the least recently used
    assert slots.take_loads() == [(0, "c")] and slots.take_loads() == []
    again = req("5", "b")
    assert slots.acquire(again) and again.lora_slot == 1  # b is still resident: no load
    assert slots.take_loads() == [] and slots.num_loads == 3
    slots.check_invariants([rc, again])


def test_a_slot_taken_twice_before_a_plan_loads_only_the_last_adapter():
    slots = LoraSlots(["a", "b"], 1)
    ra, rb = req("1", "a"), req("2", "b")
    assert slots.acquire(ra)
    slots.release(ra)  # e.g. its admission did not fit
    assert slots.acquire(rb)
    assert slots.take_loads() == [(0, "b")]


def test_radix_spaces_never_share_a_prefix():
    evicted = []
    cache = RadixCache(TokenAllocator(32), lambda key, slots, space: evicted.append(space))
    alloc = cache.allocator
    key = np.array([5, 6, 7, 8], dtype=np.int32)
    assert cache.insert(key, alloc.alloc(4)) == 0
    assert cache.insert(key, alloc.alloc(4), "a") == 0  # not a duplicate: another space
    assert len(cache.match_prefix(key, "b")[0]) == 0
    slots_a, node_a = cache.match_prefix(key[:3], "a")
    slots_base, _ = cache.match_prefix(key[:3])
    assert len(slots_a) == len(slots_base) == 3 and not set(slots_a) & set(slots_base)
    cache.inc_lock(node_a)
    assert cache.evict(100) == 5  # the base's 4 and the unlocked tail of "a"
    assert evicted.count(None) == 2 and evicted.count("a") == 1  # base: 2 nodes after a split
    cache.check_invariants(0)
    cache.dec_lock(node_a)
    cache.reset()
    assert alloc.available == alloc.total


def test_block_hash_chains_are_seeded_by_the_adapter():
    tokens = list(range(32))
    base = chain_block_hashes(tokens, 16)
    a = chain_block_hashes(tokens, 16, space_seed("a"))
    b = chain_block_hashes(tokens, 16, space_seed("b"))
    assert len({*base, *a, *b}) == 6  # no block of one space matches another's
    assert space_seed(None) == () and space_seed("a") == space_seed("a")


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_same_prompt_under_other_adapters_gets_no_cache_hit(kv):
    sched, worker = build_mode(kv, chunk_size=64, block_size=4, lora_paths=ADAPTERS)
    prompt = list(range(1, 30))
    outs: dict[str, int] = {}

    def run(rid, lora):
        sched.add(make_req(rid, prompt, 4, lora=lora))
        drive(sched, worker)
        outs.update({o.rid: o.cached_tokens for o in sched.take_outputs() if o.prompt_tokens})

    run("first", "a")
    for rid, lora in [("base", None), ("b", "b"), ("a-again", "a")]:
        run(rid, lora)
    assert outs["base"] == outs["b"] == 0
    assert outs["a-again"] == (28 if kv == "token" else 28 // 4 * 4)


def test_plans_carry_each_requests_slot_and_the_loads_before_them():
    sched, worker = build_mode("token", chunk_size=256, max_loras=2, lora_paths=ADAPTERS)
    reqs = [make_req("r0", [3, 4, 5], 3, lora="b"), make_req("r1", [8, 9, 10, 11], 3, lora="a"),
            make_req("r2", [12], 3, lora="c"), make_req("r3", [6, 7], 3)]
    for r in reqs:
        sched.add(r)
    plan = sched.plan()
    # c waits: both slots are pinned by b and a, which run; the base request behind it
    # does not wait
    assert plan.lora_slots == [0, 1, -1] and plan.lora_loads == [(0, "b"), (1, "a")]
    assert [r.rid for r in sched.waiting] == ["r2"]
    sched.on_result(worker.run(plan))
    outs = {r.rid: [] for r in reqs}
    drive(sched, worker, on_step=lambda s, _: [outs[o.rid].extend(o.token_ids)
                                               for o in s.take_outputs()])
    assert sched.loras.num_loads == 3  # r2 ran once a slot was released, "c" loaded then
    for r in reqs:  # the fake worker computes no adapter: every output is the plain one
        assert outs[r.rid] == reference(r.input_ids, 3, {0})
    sched.check_invariants()
    assert sched.loras.pins == [0, 0]


def test_unknown_adapter_is_an_error_for_that_request_alone():
    sched, worker = build_mode("token", lora_paths=ADAPTERS)
    sched.add(make_req("bad", [1, 2], 2, lora="zzz"))
    sched.add(make_req("ok", [1, 2], 2, lora="a"))
    drive(sched, worker)
    outs = {o.rid: o for o in sched.take_outputs()}
    assert outs["bad"].error == "unknown LoRA adapter 'zzz'"
    assert outs["ok"].error is None

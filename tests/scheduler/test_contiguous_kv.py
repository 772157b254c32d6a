"""Contiguous KV (`--kv contiguous`): a max-length region per request, reserved at admission."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.scheduler.kv_study.contiguous_kv import ContiguousKV
from runtime.scheduler.req import Req
from tests.scheduler.fake_worker import make_req, reference
from tests.scheduler.kv_modes import build_mode, grow, no_eos
from tests.scheduler.test_paged_kv import run_watching
from tests.scheduler.test_scheduler import check_against_reference, random_reqs, run_all


def assert_all_free(sched) -> None:
    kv = sched.kv
    assert kv.stats().used == 0 and not kv.tables
    kv.check_invariants([])


@pytest.mark.parametrize("overlap", [True, False])
def test_outputs_match_reference_with_chunked_prefill(overlap):
    sched, worker = build_mode("contiguous", chunk_size=24, overlap=overlap)
    reqs = random_reqs(24, seed=1)
    check_against_reference(reqs, run_all(sched, worker, reqs))
    assert sched.num_retractions == 0
    assert_all_free(sched)


@pytest.mark.parametrize("overlap", [True, False])
def test_admission_stops_when_no_region_fits_and_nothing_is_retracted(overlap):
    # every request reserves 20 + 60 = 80 slots: two regions fit in 200, never three
    sched, worker = build_mode(
        "contiguous", num_slots=200, chunk_size=64, overlap=overlap, schedule_conservativeness=0.0
    )
    reqs = no_eos([make_req(f"c{i}", [1 + i] * 20, 60) for i in range(8)], 60)
    running = []
    outs = run_watching(sched, worker, reqs, lambda s: running.append(len(s.running)))
    assert max(running) == 2 and sched.num_retractions == 0
    for r in reqs:
        assert outs[r.rid]["ids"] == reference(r.input_ids, 60, set()), r.rid
    assert_all_free(sched)


def test_admission_is_fcfs_behind_a_request_that_does_not_fit():
    sched, _ = build_mode("contiguous", num_slots=200, chunk_size=256)
    sched.add(make_req("a", [1] * 40, 50))  # 90 slots
    sched.add(make_req("big", [2] * 100, 50))  # 150: does not fit beside a
    sched.add(make_req("small", [3] * 5, 5))  # would fit, but waits its turn
    sched.plan()
    assert [r.rid for r in sched.running] == ["a"]
    assert [r.rid for r in sched.waiting] == ["big", "small"]
    region = sched.kv.tables["a"]
    assert (region.start, region.size, region.num_tokens) == (1, 90, 40)


def test_reserve_max_takes_the_context_per_request():
    sched, worker = build_mode(
        "contiguous", num_slots=1100, max_context=512, reserve="max", chunk_size=64
    )
    reqs = random_reqs(6, seed=3)
    running = []
    outs = run_watching(sched, worker, reqs, lambda s: running.append(len(s.running)))
    check_against_reference(reqs, outs)
    assert max(running) == 2  # 1100 // 512
    assert_all_free(sched)


def test_request_longer_than_the_pool_is_rejected_up_front():
    sched, worker = build_mode("contiguous", num_slots=100, max_context=512)
    ok = make_req("ok", [1] * 50, 50)
    outs = run_all(sched, worker, [make_req("long", [1] * 50, 60), ok])
    assert outs["long"]["reason"] == "error" and "100 tokens" in outs["long"]["error"]
    check_against_reference([ok], outs)  # its tokens and finish reason, exactly


def test_region_slots_are_consecutive_and_invariants_catch_drift():
    kv = ContiguousKV(num_slots=100, num_rows=2, reserve="request", max_context=100)
    a, b = Req(make_req("a", [1] * 10, 20)), Req(make_req("b", [2] * 30, 40))  # 30 + 70
    assert kv.admit(a) and kv.admit(b)
    np.testing.assert_array_equal(grow(kv, a, 10), np.arange(1, 11))
    np.testing.assert_array_equal(grow(kv, a, 1), [11])
    np.testing.assert_array_equal(grow(kv, b, 30), np.arange(31, 61))
    stats = kv.stats()
    assert (stats.live, stats.reserved, stats.free) == (41, 100, 0)
    assert kv.room(a) == 19 and kv.can_decode([a, b])  # growth stays inside the regions
    assert not kv.admit(Req(make_req("c", [3], 1)))  # no row left
    kv.check_invariants([a, b])
    b.slots[0] += 1
    with pytest.raises(AssertionError, match="slots != region"):
        kv.check_invariants([a, b])
    kv.release(a, cache=True)
    kv.release(b, cache=False)
    assert kv.stats().free == 100

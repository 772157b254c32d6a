"""`/flush_cache` on the scheduler: every cached prefix goes back to the pool, the next
request with the same prompt hits nothing, and a busy scheduler refuses."""

from __future__ import annotations

import pytest

from tests.scheduler.fake_worker import drive, make_req
from tests.scheduler.kv_modes import build_mode

PROMPT = list(range(1, 70))  # several full blocks in paged mode


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_flush_frees_every_cached_prefix(kv):
    sched, worker = build_mode(kv)
    sched.add(make_req("a", PROMPT, 4))
    drive(sched, worker)
    assert sched.kv.stats().cached > 0
    ok, message, freed = sched.flush_cache()
    assert ok and freed > 0 and str(freed) in message
    stats = sched.kv.stats()
    assert stats.cached == 0 and stats.free == stats.total
    hits = stats.prefix_hit_tokens
    sched.add(make_req("b", PROMPT, 4))
    drive(sched, worker)
    assert sched.kv.stats().prefix_hit_tokens == hits  # nothing left to hit


def test_busy_scheduler_refuses_and_keeps_its_cache():
    sched, worker = build_mode("token")
    sched.add(make_req("a", PROMPT, 4))
    drive(sched, worker)
    cached = sched.kv.stats().cached
    sched.add(make_req("b", [7, 8, 9], 4))  # waiting
    ok, message, freed = sched.flush_cache()
    assert not ok and freed == 0 and "1 waiting" in message
    assert sched.kv.stats().cached == cached
    drive(sched, worker)


def test_a_layout_without_prefix_cache_flushes_nothing():
    sched, worker = build_mode("contiguous")
    sched.add(make_req("a", PROMPT, 4))
    drive(sched, worker)
    assert sched.flush_cache()[0] and sched.kv.stats().used == 0

"""Degraded mode: from `degrade_waiting` waiting requests, arrivals get max_tokens capped and
admission is capped at `degrade_max_running`; it ends when the queue drains."""

from __future__ import annotations

from runtime.scheduler.scheduler import Scheduler
from runtime.scheduler.token_kv import TokenKV
from tests.scheduler.fake_worker import FakeWorker, drive, make_req


def test_degraded_mode_caps_new_requests_and_the_batch():
    sched = Scheduler(TokenKV(4096, 80), chunk_size=64, max_running=4, max_context=512,
                      degrade_waiting=3, degrade_max_tokens=2, degrade_max_running=1)
    for i in range(5):  # the 4th and 5th arrive with 3 and 4 already waiting
        sched.add(make_req(f"r{i}", [5, 6, 7, i + 8], 10, ignore_eos=True))
    assert sched.degraded and sched.max_running == 1
    assert [sched.reqs[f"r{i}"].params.max_tokens for i in range(5)] == [10, 10, 10, 2, 2]

    admitted: list[int] = []
    drive(sched, FakeWorker(4096, 80, 512),
          on_step=lambda s, _: admitted.append(len(s.running) if s.degraded else -1))
    assert not sched.degraded and sched.max_running == 4
    assert max(admitted) == 1  # while degraded, one request ran at a time

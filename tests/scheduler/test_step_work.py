"""A decode step's scheduler work does not grow with context length.

Counted, not timed: the size of the `BatchPlan` (list elements) and the memory the
scheduler allocates while planning a step and taking its result (tracemalloc's peak,
numpy buffers included). Copying a request's prompt, outputs or slot list per step would
make both grow with the context.
"""

from __future__ import annotations

import random
import tracemalloc
from collections import deque

import pytest

from runtime.wire.worker_channel import BatchPlan, StepResult
from tests.scheduler.fake_worker import make_req
from tests.scheduler.kv_modes import build_mode

REQUESTS = 16
SHORT, LONG = 320, 4800  # both multiples of the block size: the same block boundaries


def plan_elements(plan: BatchPlan) -> int:
    return (len(plan.rows) + len(plan.prefix_lens) + len(plan.extend_lens)
            + len(plan.input_ids) + len(plan.new_pages) + len(plan.sample)
            + sum(len(p) for _, p in plan.prefix_writes) + len(plan.inits))


def decode_work(kv: str, context: int, overlap: bool) -> tuple[list[int], int]:
    """(BatchPlan elements of each measured decode step, peak bytes allocated in a step)."""
    slots = REQUESTS * (context + 64) + 64
    sched, _ = build_mode(kv, num_slots=slots, rows=REQUESTS + 4, max_context=context + 64,
                          chunk_size=REQUESTS * context, overlap=overlap, block_size=16,
                          max_running=REQUESTS)
    rng = random.Random(context)
    for i in range(REQUESTS):
        prompt = [rng.randrange(1, 97) for _ in range(context)]
        sched.add(make_req(f"r{i}", prompt, 48, ignore_eos=True))
    launched: deque[BatchPlan] = deque()
    sizes, peak = [], 0

    def step() -> None:
        while sched.can_plan():
            plan = sched.plan()
            if plan is None:
                break
            launched.append(plan)
            sizes.append(plan_elements(plan))
        plan = launched.popleft()
        n = sum(plan.sample)
        sched.on_result(StepResult(plan.batch_id, [5] * n, [0.0] * n))
        sched.take_outputs()

    for _ in range(6):  # prefill, then every request decoding with slot room to grow
        step()
    assert all(not r.in_prefill for r in sched.running) and len(sched.running) == REQUESTS
    sizes.clear()
    tracemalloc.start()
    try:
        for _ in range(12):
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            step()
            peak = max(peak, tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()
    return sizes, peak


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("kv", ["token", "paged"])
def test_decode_step_work_is_independent_of_context(kv, overlap):
    short_sizes, short_peak = decode_work(kv, SHORT, overlap)
    long_sizes, long_peak = decode_work(kv, LONG, overlap)
    assert short_sizes == long_sizes  # the same plan, element for element count
    # 15x the context; copying one prompt per step would add 38 KB per request
    assert long_peak < 1.5 * short_peak + 8192, (short_peak, long_peak)


def test_paged_decode_sends_a_page_only_when_a_block_starts():
    sched, _ = build_mode("paged", num_slots=4096, rows=8, max_context=256, chunk_size=256,
                          overlap=False, block_size=16)
    sched.add(make_req("a", list(range(1, 31)), 40, ignore_eos=True))  # 30 tokens: 2 blocks
    new_pages = []
    while sched.has_work:
        plan = sched.plan()
        new_pages.append(len(plan.new_pages))
        n = sum(plan.sample)
        sched.on_result(StepResult(plan.batch_id, [5] * n, [0.0] * n))
    # prefill: 2 blocks; decodes write positions 30..68: blocks start at 32, 48, 64
    assert new_pages[0] == 2 and sum(new_pages[1:]) == 3

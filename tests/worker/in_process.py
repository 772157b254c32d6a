"""Test helper: a scheduler and a worker in one process, stepped as the server steps them."""

from __future__ import annotations

from collections import deque


def run_to_end(sched, worker, outs: dict[str, list[int]],
               cached: dict[str, int] | None = None) -> None:
    """Plan and launch until the scheduler has no work, up to its in-flight limit (so the
    overlap really overlaps), checking its invariants between batches; each request's
    output ids are appended to `outs[rid]` (and with `cached`, its cached prompt tokens
    added to `cached[rid]`)."""
    in_flight: deque = deque()
    while sched.has_work or in_flight:
        while sched.can_plan() and (plan := sched.plan()) is not None:
            in_flight.append(worker.launch(plan))  # returns before the device is done
        assert in_flight, "work left and nothing to run: the scheduler is stuck"
        sched.on_result(in_flight.popleft().result())
        if not sched.in_flight:
            sched.check_invariants()
        for out in sched.take_outputs():
            assert out.error is None, out.error
            outs[out.rid] += out.token_ids
            if cached is not None:
                cached[out.rid] += out.cached_tokens

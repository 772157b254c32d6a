"""A model's prefix rule (`WorkerReady.prefix_align` / `prefix_replay`, DeepSeek-V4's
partial blocks): prefix hits are rounded down to a multiple of the alignment in the token
and paged layouts, the first step of a hit computes the hit's last `replay` positions
again on the prefix's own pages, and the fake worker's outputs (every position read back
through the page table) stay the reference's."""

from __future__ import annotations

import random

import pytest

from tests.scheduler.fake_worker import drive, make_req
from tests.scheduler.kv_modes import build_mode
from tests.scheduler.test_scheduler import check_against_reference, collect

ALIGN, REPLAY = 8, 4


@pytest.mark.parametrize("kv,options", [
    ("token", {}),
    ("paged", dict(block_size=4)),  # hits of whole blocks, then of whole pairs of blocks
    ("paged", dict(block_size=16)),  # every block is aligned
])  # fmt: skip
def test_hits_are_aligned_and_their_last_positions_computed_again(kv, options):
    sched, worker = build_mode(kv, chunk_size=64, prefix_rule=(ALIGN, REPLAY), **options)
    shared = [random.Random(3).randrange(1, 97) for _ in range(50)]
    plans = []
    run = worker.run
    worker.run = lambda plan: plans.append(plan) or run(plan)
    outs: dict = {}
    first = make_req("first", shared, 6)
    sched.add(first)
    drive(sched, worker, on_step=collect(sched, outs))
    cuts = [13, 17, 24, 37]
    reqs = [make_req(f"hit{k}", shared[:k] + [90 + i], 5) for i, k in enumerate(cuts)]
    for req in reqs:
        sched.add(req)
    plans.clear()
    drive(sched, worker, on_step=collect(sched, outs))
    check_against_reference([first, *reqs], outs)
    unit = ALIGN if kv == "token" else max(ALIGN, options["block_size"])
    hits = [k - k % unit for k in cuts]
    assert sched.kv.stats().prefix_hit_tokens == sum(hits)
    first_steps = {}  # each request's first step: (prefix_len, extend_len, its input ids)
    for plan in plans:
        at = 0
        for row, pre, ext in zip(plan.rows, plan.prefix_lens, plan.extend_lens):
            first_steps.setdefault(row, (pre, ext, plan.input_ids[at : at + ext]))
            at += ext
    for (pre, ext, ids), req, hit in zip(first_steps.values(), reqs, hits):
        assert pre == (hit - REPLAY if hit else 0)  # the replayed positions, then the new
        assert ids == req.input_ids[pre:] and ext == len(ids)


@pytest.mark.parametrize("kv,options", [("token", {}), ("paged", dict(block_size=4))])
def test_a_hit_no_longer_than_its_replay_is_not_taken(kv, options):
    """A hit of `replay` tokens would be computed again whole: its first step starts at
    position 0, as a new request's does, so the worker could not tell it from one and
    would rewrite the prefix's rows. No hit is taken; the outputs are the reference's."""
    sched, worker = build_mode(kv, chunk_size=64, prefix_rule=(REPLAY, REPLAY), **options)
    shared = [random.Random(5).randrange(1, 97) for _ in range(REPLAY)]
    outs: dict = {}
    first = make_req("first", shared + [7], 3)
    sched.add(first)
    drive(sched, worker, on_step=collect(sched, outs))
    plans = []
    run = worker.run
    worker.run = lambda plan: plans.append(plan) or run(plan)
    second = make_req("second", shared + [8, 9], 3)
    sched.add(second)
    drive(sched, worker, on_step=collect(sched, outs))
    check_against_reference([first, second], outs)
    assert sched.kv.stats().prefix_hit_tokens == 0
    assert plans[0].prefix_writes == [] and plans[0].prefix_lens == [0]


def test_replayed_tokens_count_against_the_chunk_budget():
    """Steps of several hits admitted together compute no more than `chunk_size` tokens,
    the hits' replayed positions included; the outputs are the reference's."""
    chunk = 20
    sched, worker = build_mode("token", chunk_size=chunk, prefix_rule=(ALIGN, REPLAY))
    shared = [random.Random(7).randrange(1, 97) for _ in range(40)]
    outs: dict = {}
    first = make_req("first", shared, 3)
    sched.add(first)
    drive(sched, worker, on_step=collect(sched, outs))
    plans = []
    run = worker.run
    worker.run = lambda plan: plans.append(plan) or run(plan)
    reqs = [make_req(f"hit{i}", shared[:32] + [90 + i] * 3, 3) for i in range(4)]
    for req in reqs:
        sched.add(req)
    drive(sched, worker, on_step=collect(sched, outs))
    check_against_reference([first, *reqs], outs)
    assert max(sum(plan.extend_lens) for plan in plans) <= chunk
    assert sched.kv.stats().prefix_hit_tokens == 4 * 32

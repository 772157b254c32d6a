"""Aborts in the scheduler at every point of a request's life, in every KV layout, with the
token-hash fake worker: mid-chunked-prefill, retracted and waiting to run, running
(paged, contiguous), and while a host-tier load into its slots is in flight.

Each test checks what a user relies on, exactly: the aborted request ends with `abort`
once and its tokens are the reference's up to the abort, every other request's outputs
are the reference's, and every KV slot and row comes back (free counts equal their start
values once the prefix cache is flushed). The fake worker runs a batch only when its
result is read, after later batches were planned (as a device does), so slots handed out
again while a batch in flight still writes them change the other requests' outputs.

(Aborts during decode in token mode, of a swapped-out paged request and at the grammar
gate are in test_scheduler.py, test_host_tier.py and test_grammar_gate.py.)
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from runtime.scheduler.req import Req, ReqStatus
from tests.scheduler.fake_worker import drive, make_req, reference
from tests.scheduler.kv_modes import build_mode
from tests.scheduler.test_host_tier import conversations, run_turns
from tests.scheduler.test_scheduler import collect

MODES = [("token", True), ("token", False), ("paged", True), ("paged", False),
         ("contiguous", True), ("contiguous", False)]


def prompts(n: int, seed: int, lo: int = 8, hi: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 97) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def run_aborting(sched, worker, reqs, pick: Callable[[Req], bool]) -> tuple[dict, Req]:
    """Run `reqs`, aborting at a step boundary the first request for which `pick` holds
    (its state is seen between batches, a later one possibly in flight, as the scheduler
    process sees an AbortReq). Returns the outputs and the aborted request."""
    outs: dict = {}
    collector = collect(sched, outs)
    aborted: list[Req] = []

    def on_step(s, step):
        collector(s, step)
        if not aborted:
            aborted.extend(next(([r] for r in s.reqs.values() if pick(r)), []))
            if aborted:
                s.abort(aborted[0].rid)

    for r in reqs:
        sched.add(r)
    drive(sched, worker, on_step=on_step)
    collector(sched, None)  # what the last step left in the outbox
    assert aborted, "no request ever reached the state to abort in"
    return outs, aborted[0]


def req(rid: str, prompt: list[int], max_tokens: int):
    """A request that runs to `max_tokens` (no stop ids)."""
    r = make_req(rid, prompt, max_tokens, ignore_eos=True)
    r.stop_ids = []
    return r


def check_outputs(reqs, outs, aborted: Req) -> None:
    """Every request but `aborted` gives the reference to its end; `aborted` a prefix of
    it, then `abort`."""
    for r in reqs:
        want = reference(r.input_ids, r.params.max_tokens, set())
        got = outs.get(r.rid, {"ids": [], "reason": None})
        if r.rid == aborted.rid:
            assert got["reason"] == "abort"
            assert got["ids"] == want[:len(got["ids"])] and len(got["ids"]) < len(want)
        else:
            assert (got["ids"], got["reason"]) == (want, "length"), r.rid


def check_all_back(sched, free_at_start: int, rows_at_start: int) -> None:
    """Nothing left in the scheduler; with the prefix cache flushed, every slot is free."""
    assert not sched.reqs and not sched.running and not sched.deferred
    assert not sched.in_flight and sched.num_waiting == 0
    sched.check_invariants()
    sched.kv.flush_cache()
    stats = sched.kv.stats()
    assert (stats.free, stats.used, stats.cached) == (free_at_start, 0, 0)
    assert sched.kv.rows.available == rows_at_start


def start_counts(sched) -> tuple[int, int]:
    return sched.kv.stats().free, sched.kv.rows.available


@pytest.mark.parametrize("kv, overlap", MODES)
def test_abort_mid_chunked_prefill(kv, overlap):
    """A 150-token prompt in chunks of 32, aborted with part of its prompt computed."""
    sched, worker = build_mode(kv, num_slots=1023, rows=8, chunk_size=32, overlap=overlap)
    start = start_counts(sched)
    long = prompts(1, seed=1, lo=150, hi=151)[0]
    reqs = [req("long", long, 8)] + [req(f"r{i}", p, 12) for i, p in enumerate(prompts(4, 2))]
    outs, aborted = run_aborting(sched, worker, reqs, lambda r: r.rid == "long" and 0 < r.kv_len
                                 < len(r.prompt_ids) and r.status is ReqStatus.RUNNING)
    assert aborted.output_ids == []  # still in its prompt
    check_outputs(reqs, outs, aborted)
    check_all_back(sched, *start)


@pytest.mark.parametrize("kv, overlap", [m for m in MODES if m[0] != "contiguous"])
def test_abort_a_retracted_request_waiting_to_run(kv, overlap):
    """A pool too small for the batch retracts requests (by recompute); one of them is
    aborted while it waits to be admitted again."""
    sched, worker = build_mode(kv, num_slots=191, rows=24, chunk_size=64, overlap=overlap,
                               schedule_conservativeness=0.0)
    start = start_counts(sched)
    reqs = [req(f"r{i}", p, 40) for i, p in enumerate(prompts(12, 3))]
    # one that had produced tokens: they are recomputed on its return, which never comes
    outs, aborted = run_aborting(sched, worker, reqs, lambda r: r.retractions > 0
                                 and r.status is ReqStatus.WAITING and r.output_ids)
    check_outputs(reqs, outs, aborted)
    check_all_back(sched, *start)


@pytest.mark.parametrize("kv, overlap", [m for m in MODES if m[0] != "token"])
def test_abort_running_mid_decode(kv, overlap):
    sched, worker = build_mode(kv, num_slots=1023, rows=8, chunk_size=64, overlap=overlap)
    start = start_counts(sched)
    reqs = [req(f"r{i}", p, 30) for i, p in enumerate(prompts(6, 4))]
    outs, aborted = run_aborting(sched, worker, reqs, lambda r: r.rid == "r2"
                                 and len(r.output_ids) >= 5)
    assert not aborted.in_prefill
    check_outputs(reqs, outs, aborted)
    check_all_back(sched, *start)


@pytest.mark.parametrize("overlap", [True, False])
def test_abort_while_a_host_tier_load_into_its_slots_is_in_flight(overlap):
    """Second turns find their history on the host; the first request whose load is in a
    planned batch is aborted before that batch has run. The load still lands in its
    device slots, which must not go to anyone else before the batch is done."""
    convs = conversations(10, 2, seed=5)
    sched, worker = build_mode("token", num_slots=160, rows=16, host_slots=4096,
                               host_kv_gib=1, overlap=overlap, chunk_size=64)
    start = start_counts(sched)
    history = run_turns(sched, worker, [[c[0]] for c in convs])  # first turns only
    plan, aborted = sched.plan, []

    def plan_and_abort():
        batch = plan()
        if batch is not None and len(batch.load_dev) and not aborted:
            loaded = set(batch.load_dev)
            req = next(r for r in sched.reqs.values() if loaded & set(r.slots.tolist()))
            aborted.append(req)
            sched.abort(req.rid)  # the batch is launched, not run
        return batch

    sched.plan = plan_and_abort
    reqs = [req(f"c{c}t1", history[c] + conv[1], 6) for c, conv in enumerate(convs)]
    outs: dict = {}
    for r in reqs:
        sched.add(r)
    drive(sched, worker, on_step=collect(sched, outs))
    collect(sched, outs)(sched, None)
    assert aborted, "no second turn was loaded from the host"
    assert sched.kv.stats().host.load_tokens > 0
    check_outputs(reqs, outs, aborted[0])
    assert outs[aborted[0].rid]["ids"] == []
    sched.kv.host.check_invariants()
    check_all_back(sched, *start)

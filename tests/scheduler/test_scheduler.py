"""The scheduler state machine, driven by a token-hash fake worker (no model, no processes)."""

from __future__ import annotations

import random

import pytest

from runtime.scheduler.scheduler import Scheduler
from runtime.scheduler.token_kv import TokenKV
from runtime.wire.request_output import FinishReason
from tests.scheduler.fake_worker import EOS, FakeWorker, drive, make_req, reference

MAX_CONTEXT = 512


def build(num_slots=4096, rows=80, overlap=True, chunk_size=32, max_running=64, **kw):
    sched = Scheduler(TokenKV(num_slots, rows), chunk_size=chunk_size, max_running=max_running,
                      max_context=MAX_CONTEXT, max_in_flight=2 if overlap else 1, **kw)
    return sched, FakeWorker(num_slots, rows, MAX_CONTEXT)


def collect(sched, outs):
    def on_step(s, _):
        for o in s.take_outputs():
            rec = outs.setdefault(o.rid, {"ids": [], "reason": None, "error": None})
            assert rec["reason"] is None, f"{o.rid} got output after finishing"
            rec["ids"] += o.token_ids
            rec["reason"], rec["error"] = o.finish_reason, o.error
    return on_step


def run_all(sched, worker, reqs):
    outs: dict = {}
    for r in reqs:
        sched.add(r)
    drive(sched, worker, on_step=collect(sched, outs))
    for o in sched.take_outputs():
        outs.setdefault(o.rid, {"ids": [], "reason": o.finish_reason, "error": o.error})
    return outs


def check_against_reference(reqs, outs):
    for r in reqs:
        want = reference(r.input_ids, r.params.max_tokens, {EOS})
        got = outs[r.rid]
        assert got["ids"] == want, r.rid
        assert got["reason"] == ("stop" if want and want[-1] == EOS else "length")


def random_reqs(n, seed, prefix=(), max_prompt=60, max_tokens=40):
    rng = random.Random(seed)
    return [make_req(f"r{i}", list(prefix) + [rng.randrange(1, 97) for _ in
                     range(rng.randint(1, max_prompt))], rng.randint(1, max_tokens))
            for i in range(n)]


@pytest.mark.parametrize("overlap", [True, False])
def test_outputs_match_reference_with_chunked_prefill(overlap):
    sched, worker = build(overlap=overlap, chunk_size=24)
    reqs = random_reqs(24, seed=1)
    check_against_reference(reqs, run_all(sched, worker, reqs))
    assert sched.kv.stats().used == 0  # everything free or evictable


@pytest.mark.parametrize("overlap", [True, False])
def test_tiny_pool_forces_retraction_and_keeps_outputs(overlap):
    sched, worker = build(num_slots=160, overlap=overlap, chunk_size=64)
    sched.adder.ratio = sched.adder.init_ratio = sched.adder.min_ratio = 0.0
    reqs = random_reqs(16, seed=2, max_prompt=20, max_tokens=60)
    reqs = [make_req(r.rid, r.input_ids, 60, ignore_eos=True) for r in reqs]
    for r in reqs:
        r.stop_ids = []
    outs = run_all(sched, worker, reqs)
    assert sched.num_retractions > 0
    for r in reqs:
        assert outs[r.rid]["ids"] == reference(r.input_ids, 60, set()), r.rid


@pytest.mark.parametrize("overlap", [True, False])
def test_prefix_cache_hits_keep_outputs(overlap):
    sched, worker = build(overlap=overlap, chunk_size=64, max_running=4)
    shared = [random.Random(3).randrange(1, 97) for _ in range(50)]
    reqs = random_reqs(12, seed=4, prefix=shared, max_prompt=10)
    reqs.append(make_req("again", reqs[0].input_ids, reqs[0].params.max_tokens))
    check_against_reference(reqs, run_all(sched, worker, reqs))
    assert sched.kv.stats().prefix_hit_tokens >= 50 * 8


def test_abort_mid_stream_frees_kv_and_reports_abort():
    sched, worker = build()
    reqs = [make_req(f"a{i}", [5 + i] * 30, 200, ignore_eos=True) for i in range(6)]
    for r in reqs:
        r.stop_ids = []
    outs: dict = {}
    collector = collect(sched, outs)

    def on_step(s, step):
        collector(s, step)
        if step == 5:
            s.abort("a1")
            s.finish("a2")  # a stop string: the api already answered this client
    for r in reqs:
        sched.add(r)
    drive(sched, worker, on_step=on_step)
    assert outs["a1"]["reason"] == "abort"
    assert outs["a2"]["reason"] is None  # silent: no second finish to the client
    assert outs["a0"]["reason"] == "length" and len(outs["a0"]["ids"]) == 200
    assert sched.kv.stats().used == 0
    assert not sched.reqs


def test_a_stop_string_finish_caches_its_kv_and_an_api_error_does_not():
    sched, worker = build()
    for rid, token in (("stopped", 3), ("failed", 4)):
        sched.add(make_req(rid, [token] * 40, 200, ignore_eos=True, stop_token_ids=[]))
    outs: dict = {}
    collector = collect(sched, outs)

    def on_step(s, step):
        collector(s, step)
        if step == 5:
            s.finish("stopped")  # the api matched a stop string
            s.abort("failed", reason=FinishReason.ERROR)  # the api could not detokenize
    drive(sched, worker, on_step=on_step)
    assert outs["stopped"]["reason"] is None and outs["failed"]["reason"] == FinishReason.ERROR
    assert not sched.reqs and sched.kv.stats().used == 0
    again = {}
    for rid, token in (("stopped-again", 3), ("failed-again", 4)):
        sched.add(make_req(rid, [token] * 40, 1))
    drive(sched, worker, on_step=lambda s, _: again.update(
        {o.rid: o.cached_tokens for o in s.take_outputs() if o.prompt_tokens}))
    assert again["stopped-again"] >= 32 and again["failed-again"] == 0


@pytest.mark.parametrize("overlap, want", [(True, 2), (False, 1)])
def test_overlap_keeps_two_batches_in_flight_and_sync_one(overlap, want):
    sched, worker = build(overlap=overlap)
    seen = []
    orig = sched.plan

    def plan():
        p = orig()
        seen.append(len(sched.in_flight))
        return p
    sched.plan = plan
    reqs = random_reqs(4, seed=5)
    check_against_reference(reqs, run_all(sched, worker, reqs))
    assert max(seen) == want


def test_finished_request_slots_released_only_after_last_batch():
    sched, worker = build(overlap=True)
    sched.add(make_req("x", [1, 2, 3], 2))
    p0 = sched.plan()  # prefill, samples token 1
    p1 = sched.plan()  # decode, samples token 2 (placeholder input)
    assert p1.input_ids == [-(p0.rows[0] + 1)]
    sched.on_result(worker.run(p0))
    sched.on_result(worker.run(p1))
    assert sched.kv.stats().used == 0
    # EOS case: request stops at batch N but batch N+1 already holds a slot for it
    sched.add(make_req("y", [4], 50))
    q0 = sched.plan()
    q1 = sched.plan()
    res0 = worker.run(q0)
    res0.next_ids = [EOS]  # force a stop at N
    sched.on_result(res0)
    req = sched.deferred[0]
    assert req.rid == "y" and req.row is not None
    in_use_before = sched.kv.stats().used
    assert in_use_before > 0  # N+1 still references the request's KV
    sched.on_result(worker.run(q1))
    assert not sched.deferred and sched.kv.stats().used == 0


def test_bad_requests_get_errors_and_cost_nothing():
    sched, worker = build()
    ok = make_req("ok", [1, 2], 3)
    outs = run_all(sched, worker, [make_req("empty", [], 4), make_req("long", [1] * 500, 100),
                                   ok])
    assert outs["empty"]["reason"] == "error" and "empty" in outs["empty"]["error"]
    assert outs["long"]["reason"] == "error" and "512" in outs["long"]["error"]
    check_against_reference([ok], outs)  # its tokens and finish reason, exactly
    assert sched.kv.stats().used == 0


def test_priority_orders_admission():
    sched, worker = build(max_running=1)
    for i in range(4):
        sched.add(make_req(f"low{i}", [1, 2, 3 + i], 2, priority=0))
    sched.add(make_req("high", [9, 9], 2, priority=5))
    first = sched.plan()
    assert sched.running[0].rid == "high" and len(first.rows) == 1


def test_failed_batch_ends_its_requests_with_errors_and_caches_nothing():
    sched, worker = build(overlap=True, chunk_size=512)
    sched.add(make_req("a", list(range(1, 40)), 10))
    sched.add(make_req("b", list(range(1, 30)), 10))
    sched.plan()
    second = sched.plan()
    sched.fail_in_flight("device error")  # the worker reports the first batch failed
    sched.on_result(worker.run(second))
    outs = {o.rid: o for o in sched.take_outputs() if o.finish_reason}
    assert outs["a"].finish_reason == outs["b"].finish_reason == "error"
    assert outs["a"].error == "device error"
    assert not sched.has_work and not sched.deferred
    assert sched.kv.cache.evictable_size == 0  # unwritten KV never enters the prefix cache
    assert sched.kv.stats().used == 0


def test_lone_tokens_go_to_the_api_as_columns_in_order():
    """A decode step's one-token outputs travel as BatchOut columns. Taken only every
    third step (so a request's first ReqOut and its next tokens share a batch), the
    outputs still apply in order and match the reference; logprob requests never use the
    columns."""
    reqs = random_reqs(12, seed=4, max_tokens=30)
    for r in reqs[::3]:
        r.params.logprobs = True
    sched, worker = build(overlap=False)
    outs: dict = {}
    columns = 0

    def record(batch) -> None:
        for o in batch.expanded():
            rec = outs.setdefault(o.rid, {"ids": [], "lps": 0, "reason": None, "error": None})
            assert rec["reason"] is None, f"{o.rid} got output after finishing"
            assert not rec["ids"] or not o.prompt_tokens, "the header comes first"
            rec["ids"] += o.token_ids
            rec["lps"] += len(o.logprobs)
            rec["reason"], rec["error"] = o.finish_reason, o.error

    def on_step(s, step):
        nonlocal columns
        if step % 3 == 0 and (batch := s.take_batch()) is not None:
            columns += len(batch.rids)
            assert not set(batch.rids) & {r.rid for r in reqs[::3]}
            record(batch)

    for r in reqs:
        sched.add(r)
    drive(sched, worker, on_step=on_step)
    if (batch := sched.take_batch()) is not None:
        record(batch)
    check_against_reference(reqs, outs)
    assert columns > sum(r.params.max_tokens for r in reqs) // 3
    assert all(outs[r.rid]["lps"] == len(outs[r.rid]["ids"]) for r in reqs[::3])

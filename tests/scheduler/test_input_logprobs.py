"""Input (prompt) logprobs and prefill-only requests in the scheduler, on the fake worker.

The fake worker's input logprob of a position hashes the KV read back through the
request's slots, so a logprob that came from a cached prefix or a wrong chunk boundary,
or that was lost or duplicated across a retraction, differs from the reference.
"""

from __future__ import annotations

import random

import pytest

from runtime.scheduler.scheduler import Scheduler
from runtime.scheduler.token_kv import TokenKV
from tests.scheduler.fake_worker import (
    EOS,
    FakeWorker,
    drive,
    make_req,
    reference,
    reference_input_logprobs,
)
from tests.scheduler.kv_modes import build_mode

MAX_CONTEXT = 512


def build(num_slots=4096, overlap=True, chunk_size=16, **kw):
    sched = Scheduler(TokenKV(num_slots, 80), chunk_size=chunk_size, max_running=64,
                      max_context=MAX_CONTEXT, max_in_flight=2 if overlap else 1, **kw)
    return sched, FakeWorker(num_slots, 80, MAX_CONTEXT)


def run(sched, worker, reqs):
    """Drive to completion; per request: output ids, input logprobs, finish reason, cached."""
    outs: dict = {}

    def on_step(s, _):
        for o in s.take_outputs():
            rec = outs.setdefault(o.rid, {"ids": [], "input": [], "reason": None, "cached": 0})
            assert rec["reason"] is None, f"{o.rid} got output after finishing"
            rec["ids"] += o.token_ids
            rec["input"] += o.input_logprobs
            rec["reason"] = o.finish_reason
            rec["cached"] = max(rec["cached"], o.cached_tokens)

    for r in reqs:
        sched.add(r)
    drive(sched, worker, on_step=on_step)
    return outs


def prompt(rng, n):
    return [rng.randrange(1, 97) for _ in range(n)]


@pytest.mark.parametrize("overlap", [True, False])
def test_input_logprobs_span_chunks_and_skip_the_cached_prefix(overlap):
    sched, worker = build(overlap=overlap, chunk_size=16)
    rng = random.Random(1)
    shared = prompt(rng, 40)
    warm = make_req("warm", shared + prompt(rng, 5), 3)
    run(sched, worker, [warm])  # caches `shared` and more
    reqs = [make_req(f"r{start}", shared + prompt(rng, 30), 4, logprob_start_len=start)
            for start in (0, 1, 7, 25, 39, 40, 41, 60, 70, 71, 500)]
    outs = run(sched, worker, reqs)
    for r in reqs:
        start = r.params.logprob_start_len
        want = reference_input_logprobs(r.input_ids, start)
        assert outs[r.rid]["input"] == want, r.rid
        assert outs[r.rid]["ids"] == reference(r.input_ids, 4, {EOS}), r.rid
        # the radix cache served only positions before the first one whose logits count
        assert outs[r.rid]["cached"] <= max(min(start, 70), 1) - 1, r.rid
    assert outs["r41"]["cached"] == 40  # ... but it did serve those


@pytest.mark.parametrize("overlap", [True, False])
def test_prefill_only_requests_compute_and_cache_the_prompt(overlap):
    sched, worker = build(overlap=overlap, chunk_size=7)
    rng = random.Random(2)
    p = prompt(rng, 23)
    outs = run(sched, worker, [make_req("fill", p, 0)])
    assert outs["fill"] == {"ids": [], "input": [], "reason": "length", "cached": 0}
    outs = run(sched, worker, [make_req("score", p + [5, 6], 0, logprob_start_len=20),
                               make_req("gen", p + [9], 2)])
    assert outs["score"]["input"] == reference_input_logprobs(p + [5, 6], 20)
    assert outs["score"]["ids"] == [] and outs["score"]["reason"] == "length"
    assert outs["score"]["cached"] == 19  # the prefix-only request's KV was cached
    assert outs["gen"]["cached"] == 23
    assert sched.kv.stats().used == 0


def test_chunk_boundary_one_before_the_end_of_a_prefill_only_prompt():
    """A chunk that stops one token short leaves the last position to a decode-like step."""
    sched, worker = build(chunk_size=8)
    rng = random.Random(3)
    p = prompt(rng, 9)  # chunk 1: 8 tokens, then 1
    outs = run(sched, worker, [make_req("x", p, 0, logprob_start_len=2)])
    assert outs["x"]["input"] == reference_input_logprobs(p, 2)
    assert outs["x"]["reason"] == "length"


@pytest.mark.parametrize("overlap", [True, False])
def test_retraction_neither_loses_nor_repeats_input_logprobs(overlap):
    sched, worker = build(num_slots=200, overlap=overlap, chunk_size=24)
    sched.adder.ratio = sched.adder.init_ratio = sched.adder.min_ratio = 0.0
    rng = random.Random(4)
    reqs = [make_req(f"r{i}", prompt(rng, 30), 40, ignore_eos=True,
                     logprob_start_len=rng.randrange(0, 30)) for i in range(8)]
    for r in reqs:
        r.stop_ids = []
    outs = run(sched, worker, reqs)
    assert sched.num_retractions > 0
    for r in reqs:
        want = reference_input_logprobs(r.input_ids, r.params.logprob_start_len)
        assert outs[r.rid]["input"] == want, r.rid
        assert outs[r.rid]["ids"] == reference(r.input_ids, 40, set()), r.rid


@pytest.mark.parametrize("kv, options", [("paged", {"block_size": 16}),
                                         ("paged", {"block_size": "dynamic"}),
                                         ("contiguous", {})])
def test_other_kv_modes_give_the_same_input_logprobs(kv, options):
    sched, worker = build_mode(kv, chunk_size=16, **options)
    rng = random.Random(5)
    shared = prompt(rng, 48)
    run(sched, worker, [make_req("warm", shared + [1, 2], 2)])
    reqs = [make_req(f"r{s}", shared + prompt(rng, 10), 3, logprob_start_len=s)
            for s in (0, 20, 47, 52)]
    outs = run(sched, worker, reqs)
    for r in reqs:
        want = reference_input_logprobs(r.input_ids, r.params.logprob_start_len)
        assert outs[r.rid]["input"] == want, r.rid

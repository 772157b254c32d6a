"""Constrained requests wait in the scheduler until every worker compiled their grammar;
the workers' compiled cache is an LRU bounded by its size. Driven by the token-hash fake
worker, with compiles answered by the test (no xgrammar, no model)."""

from __future__ import annotations

from collections import deque

from runtime.scheduler.grammar_gate import GrammarGate
from runtime.wire.worker_channel import GrammarCompiled
from tests.scheduler.fake_worker import EOS, make_req, reference
from tests.scheduler.test_scheduler import build, collect

A, B, C = "a+", "b+", "c+"  # regexes; the cache holds their grammar keys
KEY = {r: "regex:" + r for r in (A, B, C)}


def gated(capacity=64, ranks=1, **kw):
    sched, worker = build(**kw)
    sched.grammars = GrammarGate(capacity, ranks)
    return sched, worker


def step(sched, worker, outs):
    """Plan one step, run it, take its result; the plan."""
    plan = sched.plan()
    sched.on_result(worker.run(plan))
    collect(sched, outs)(sched, 0)
    return plan


def bound_regexes(plan) -> list[str]:
    return [i.params.regex for i in plan.inits if i.params.regex is not None]


def compiled(regex, **kw):
    return GrammarCompiled(KEY[regex], **kw)


def test_a_regex_request_waits_for_every_rank_while_others_stream():
    sched, worker = gated(ranks=2)
    outs: dict = {}
    sched.add(make_req("plain", [5, 6, 7], 20))
    sched.add(make_req("rx", [8, 9], 6, regex=A))
    assert sched.num_waiting == 2 and sched.grammars.held[0].rid == "rx"
    update = sched.take_grammar_update()
    assert update.compile == [KEY[A]] and update.evict == []
    assert sched.take_grammar_update() is None  # asked once
    for _ in range(3):
        assert bound_regexes(step(sched, worker, outs)) == []
    sched.on_grammar_compiled(compiled(A, rank=1))
    assert bound_regexes(step(sched, worker, outs)) == []  # rank 0 has not answered
    sched.on_grammar_compiled(compiled(A, rank=0))
    assert bound_regexes(step(sched, worker, outs)) == [A]
    assert len(outs["plain"]["ids"]) == 5  # one token a step, the regex never in the way
    while sched.has_work or sched.in_flight:
        step(sched, worker, outs)
    assert outs["plain"]["ids"] == reference([5, 6, 7], 20, {EOS})
    assert outs["rx"]["ids"] == reference([8, 9], 6, {EOS})


def test_a_failed_compile_finishes_its_requests_with_the_error_and_is_retried_later():
    sched, worker = gated(ranks=2)
    outs: dict = {}
    sched.add(make_req("rx1", [1, 2], 4, regex=A))
    sched.add(make_req("rx2", [3, 4], 4, regex=A))
    assert sched.take_grammar_update().compile == [KEY[A]]
    sched.on_grammar_compiled(compiled(A, rank=0))
    sched.on_grammar_compiled(compiled(A, rank=1, error="grammar compilation failed: boom"))
    collect(sched, outs)(sched, 0)
    for rid in ("rx1", "rx2"):
        assert outs[rid]["reason"] == "error" and "boom" in outs[rid]["error"]
    assert not sched.has_work and sched.num_waiting == 0 and not sched.reqs
    assert sched.kv.stats().used == 0  # never held any KV
    sched.add(make_req("rx3", [5], 4, regex=A))
    update = sched.take_grammar_update()
    # drop the failure, then try again
    assert update.evict == [KEY[A]] and update.compile == [KEY[A]]


def test_an_aborted_request_leaves_the_gate():
    sched, worker = gated()
    outs: dict = {}
    sched.add(make_req("rx", [1, 2], 4, regex=A))
    sched.take_grammar_update()
    sched.abort("rx")
    collect(sched, outs)(sched, 0)
    assert outs["rx"]["reason"] == "abort" and sched.num_waiting == 0 and not sched.reqs
    sched.on_grammar_compiled(compiled(A))  # the compile still finishes: nobody waits
    assert not sched.has_work


def test_the_cache_evicts_the_least_recently_used_regex_at_its_bound():
    sched, worker = gated(capacity=2)
    outs: dict = {}
    for i, regex in enumerate((A, B)):
        sched.add(make_req(f"r{i}", [1 + i], 3, regex=regex))
        assert sched.take_grammar_update().compile == [KEY[regex]]
        sched.on_grammar_compiled(compiled(regex))
    sched.add(make_req("again", [7], 3, regex=A))  # A is ready: no compile, and now recent
    assert sched.take_grammar_update() is None and sched.num_waiting == 3
    while sched.has_work or sched.in_flight:
        step(sched, worker, outs)
    sched.add(make_req("new", [8], 3, regex=C))
    update = sched.take_grammar_update()
    assert update.compile == [KEY[C]] and update.evict == [KEY[B]]
    assert list(sched.grammars.cache) == [KEY[A], KEY[C]]


def test_a_regex_a_queued_request_needs_stays_until_it_is_admitted():
    sched, worker = gated(capacity=1)
    outs: dict = {}
    sched.add(make_req("ra", [1, 2], 3, regex=A))
    sched.take_grammar_update()
    sched.on_grammar_compiled(compiled(A))
    sched.add(make_req("rb", [3, 4], 3, regex=B))
    assert sched.take_grammar_update() is None  # A is pinned by "ra": B waits for room
    assert bound_regexes(step(sched, worker, outs)) == [A]
    update = sched.take_grammar_update()  # "ra" runs: its row keeps its matcher
    assert update.evict == [KEY[A]] and update.compile == [KEY[B]]


class CompilingWorker:
    """The fake worker plus a compiled cache that follows `GrammarCacheUpdate`s; every
    compile is answered one step after it was asked for."""

    def __init__(self, sched, worker, capacity):
        self.sched, self.worker, self.capacity = sched, worker, capacity
        self.cache: set[str] = set()
        self.ready: set[str] = set()
        self.compiling: list[str] = []
        self.compiles = 0

    def send_update(self):
        update = self.sched.take_grammar_update()
        if update is None:
            return
        self.cache -= set(update.evict)
        self.ready -= set(update.evict)
        self.cache |= set(update.compile)
        assert len(self.cache) <= self.capacity
        self.compiling += update.compile
        self.compiles += len(update.compile)

    def run(self, outs, max_steps=5000):
        launched = deque()
        for _ in range(max_steps):
            if not (self.sched.has_work or launched or self.sched.grammars.held):
                return
            self.send_update()
            while self.sched.can_plan() and (plan := self.sched.plan()) is not None:
                # a row is only ever bound to a regex the worker holds compiled
                assert {KEY[r] for r in bound_regexes(plan)} <= self.ready
                launched.append(plan)
            self.send_update()
            if launched:
                self.sched.on_result(self.worker.run(launched.popleft()))
            for key in self.compiling:
                self.ready.add(key)
                self.sched.on_grammar_compiled(GrammarCompiled(key))
            self.compiling = []
            collect(self.sched, outs)(self.sched, 0)
            if not self.sched.in_flight:
                self.sched.check_invariants()
        raise AssertionError("the scheduler never finished")


def test_retracted_requests_recompile_an_evicted_regex_and_keep_their_outputs():
    sched, worker = gated(capacity=1, num_slots=160, chunk_size=64)
    sched.adder.ratio = sched.adder.init_ratio = sched.adder.min_ratio = 0.0
    regexes = [A, B, C]
    reqs = [
        make_req(f"r{i}", [1 + i, 2 + i, 3 + i], 60, ignore_eos=True, regex=regexes[i % 3])
        for i in range(9)
    ]
    for r in reqs:
        r.stop_ids = []
        sched.add(r)
    driver = CompilingWorker(sched, worker, capacity=1)
    outs: dict = {}
    driver.run(outs)
    assert sched.num_retractions > 0 and driver.compiles > len(regexes)
    for r in reqs:
        assert outs[r.rid]["ids"] == reference(r.input_ids, 60, set()), r.rid
        assert outs[r.rid]["reason"] == "length"
    assert sched.kv.stats().used == 0 and not sched.reqs

"""The host KV tier under the radix cache and swap preemption, with the token-hash fake
worker: the plans' copy orders move the fake KV between a device and a host array, so a
prefix written back, loaded into the wrong slots or lost changes the outputs."""

from __future__ import annotations

import random

import numpy as np
import pytest

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.scheduler.host_tier import HostTier
from tests.scheduler.fake_worker import EOS, drive, make_req, reference
from tests.scheduler.kv_modes import build_mode
from tests.scheduler.test_scheduler import collect


def conversations(n: int, turns: int, seed: int = 0):
    """Per turn, one request per conversation: its whole history plus a new user turn
    (the history's outputs are filled in by `run_turns`)."""
    rng = random.Random(seed)
    return [[[rng.randrange(1, 97) for _ in range(rng.randrange(8, 24))] for _ in range(turns)]
            for _ in range(n)]


def run_turns(sched, worker, convs, max_tokens=6):
    """Run the conversations turn by turn; every output must equal the reference."""
    history = [[] for _ in convs]
    for t in range(len(convs[0])):
        outs: dict = {}
        for c, conv in enumerate(convs):
            history[c] = history[c] + conv[t]
            sched.add(make_req(f"c{c}t{t}", history[c], max_tokens, ignore_eos=True))
        drive(sched, worker, on_step=collect(sched, outs))
        for c in range(len(convs)):
            got = outs[f"c{c}t{t}"]
            assert got["error"] is None, got["error"]
            assert got["ids"] == reference(history[c], max_tokens, {EOS}), (c, t)
            history[c] = history[c] + got["ids"]
    return history


@pytest.mark.parametrize("overlap", [True, False])
def test_multi_turn_prefixes_come_back_from_the_host(overlap):
    """12 conversations of 4 turns on a pool of a fraction of their history: later turns
    find their history on the host (loaded back, identical outputs)."""
    convs = conversations(12, 4)
    sched, worker = build_mode("token", num_slots=160, rows=16, host_slots=4096,
                               host_kv_gib=1, overlap=overlap, chunk_size=64)
    run_turns(sched, worker, convs)
    host = sched.kv.stats().host
    assert host.hit_tokens > 0 and host.load_tokens == host.hit_tokens
    assert host.writeback_tokens > 0 and host.used > 0
    sched.check_invariants()


class CopyRaceCheck:
    """Wraps a scheduler's `plan` and a fake worker's `run`: fails if a plan's copies touch
    a device slot that a batch in flight when it was planned reads or writes. On a GPU the
    copies run on a stream that does not wait for the forwards in flight (see
    runtime/worker/kv_transfer.py): this is the rule that makes that safe."""

    def __init__(self, sched, worker) -> None:
        self.sched, self.worker = sched, worker
        self._plan, self._run = sched.plan, worker.run
        sched.plan, worker.run = self.plan, self.run
        self.behind: dict[int, list[int]] = {}  # batch id -> batches in flight at planning
        self.touched: dict[int, set[int]] = {}  # batch id -> slots its forward read or wrote
        self.checked = 0  # plans with copies, planned while a batch was in flight

    def plan(self):
        plan = self._plan()
        if plan is not None:  # the new batch is the last one in flight
            self.behind[plan.batch_id] = [b.batch_id for b in list(self.sched.in_flight)[:-1]]
        return plan

    def run(self, plan):
        copies = set(plan.writeback_dev) | set(plan.load_dev)
        for b in self.behind.pop(plan.batch_id):
            assert not copies & self.touched[b], (plan.batch_id, b, copies & self.touched[b])
            self.checked += bool(copies)
        res = self._run(plan)
        w = self.worker
        self.touched[plan.batch_id] = {
            w.slot(row, pos) for row, p, e in zip(plan.rows, plan.prefix_lens, plan.extend_lens)
            for pos in range(p + e)}
        return res


@pytest.mark.parametrize("preempt", ["recompute", "swap"])
def test_copies_never_touch_the_slots_of_a_batch_in_flight(preempt):
    convs = conversations(12, 4, seed=5)
    sched, worker = build_mode("token", num_slots=160, rows=16, host_slots=4096,
                               host_kv_gib=1, overlap=True, chunk_size=64, preempt=preempt,
                               schedule_conservativeness=0.0)
    check = CopyRaceCheck(sched, worker)
    run_turns(sched, worker, convs)
    host = sched.kv.stats().host
    assert host.load_tokens > 0 and host.writeback_tokens > 0
    assert check.checked > 0  # copies really were planned beside a batch in flight
    assert sched.num_swaps > 0 or preempt == "recompute"


def test_host_tier_raises_the_hit_rate_over_the_device_alone():
    convs = conversations(12, 4, seed=1)
    rates = {}
    for host_slots in (0, 4096):
        options = {"host_kv_gib": 1} if host_slots else {}
        sched, worker = build_mode("token", num_slots=160, rows=16, host_slots=host_slots,
                                   chunk_size=64, **options)
        run_turns(sched, worker, convs)
        kv = sched.kv.stats()
        rates[host_slots] = kv.prefix_hit_tokens / kv.prefix_query_tokens
    assert rates[4096] > rates[0] + 0.2, rates


def test_a_full_host_tier_evicts_and_never_fails_a_request():
    """A host tier of 48 slots holds a few prefixes at a time: it evicts its least
    recently used ones, and every request still gets the right tokens."""
    convs = conversations(10, 3, seed=2)
    sched, worker = build_mode("token", num_slots=128, rows=16, host_slots=48,
                               host_kv_gib=1, chunk_size=64)
    run_turns(sched, worker, convs)
    host = sched.kv.stats().host
    assert host.writeback_tokens > host.total  # it really overflowed
    sched.check_invariants()


def test_write_back_keeps_the_path_and_evicts_lru_on_the_host():
    tier = HostTier(8)
    a, b = np.arange(1, 6, dtype=np.int32), np.arange(10, 15, dtype=np.int32)
    tier.write_back(np.array([1, 2, 3]), np.array([7, 8, 9]))
    tier.write_back(np.array([1, 2, 3, 4, 5]), np.array([7, 8, 9, 4, 6]))  # only 4, 5 copied
    orders = tier.take_orders()
    assert orders.writeback_dev.tolist() == [7, 8, 9, 4, 6]
    assert len(orders.writeback_host) == 5 and not len(orders.load_host)
    assert tier.match(a, 2).tolist() == orders.writeback_host[2:].tolist()
    tier.take_orders()  # unpins
    tier.write_back(b, np.arange(20, 25, dtype=np.int32))  # needs 5 of 3 free: evicts a's tail
    assert tier.stats().used == 8 and tier.writeback_tokens == 10
    assert len(tier.match(a, 0)) == 3  # [1, 2, 3] survived: its leaf [4, 5] went
    tier.check_invariants()


def test_a_pinned_host_prefix_is_not_evicted_before_its_load_is_planned():
    tier = HostTier(4)
    tier.write_back(np.array([1, 2, 3, 4]), np.array([5, 6, 7, 8]))
    tier.take_orders()
    held = tier.match(np.array([1, 2, 3, 4]), 0)
    tier.write_back(np.array([9, 9]), np.array([1, 2]))  # no room: dropped, not evicted over
    assert tier.match(np.array([1, 2, 3, 4]), 0).tolist() == held.tolist()
    assert tier.take_orders() is None  # nothing was copied
    tier.check_invariants()


def test_a_host_slot_reused_within_one_step_gets_only_its_last_write_back():
    """One launch copies in no particular order: a host slot evicted and written again
    before the orders are taken must be the destination of one order, the later one."""
    tier = HostTier(4)
    tier.write_back(np.array([1, 2, 3, 4]), np.array([5, 6, 7, 8]))
    tier.write_back(np.array([9, 9, 9]), np.array([10, 11, 12]))  # evicts [1..4] for room
    orders = tier.take_orders()
    host = orders.writeback_host.tolist()
    assert len(set(host)) == len(host)
    assert tier.match(np.array([9, 9, 9]), 0).tolist() == [
        h for d, h in zip(orders.writeback_dev.tolist(), host) if d in (10, 11, 12)]
    assert {10, 11, 12} <= set(orders.writeback_dev.tolist())
    tier.check_invariants()


@pytest.mark.parametrize("kv, overlap", [("token", True), ("token", False), ("paged", False),
                                         ("paged", True)])
def test_swap_preemption_gives_the_recompute_outputs_and_loads_kv_back(kv, overlap):
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 97) for _ in range(rng.randrange(20, 60))] for _ in range(16)]
    runs = {}
    for preempt in ("recompute", "swap"):
        sched, worker = build_mode(kv, num_slots=319, rows=24, host_slots=4096,
                                   host_kv_gib=1, preempt=preempt, overlap=overlap,
                                   chunk_size=64, schedule_conservativeness=0.0)
        outs: dict = {}
        for i, p in enumerate(prompts):
            sched.add(make_req(f"r{i}", p, 40, ignore_eos=True))
        drive(sched, worker, on_step=collect(sched, outs))
        for i, p in enumerate(prompts):
            assert outs[f"r{i}"]["ids"] == reference(p, 40, {EOS})
        assert sched.num_retractions > 0
        runs[preempt] = sched
    swap = runs["swap"]
    assert swap.num_swaps > 0 and swap.kv.stats().host.load_tokens > 0
    assert runs["recompute"].num_swaps == 0
    assert swap.kv.stats().host.used == 0 or kv == "token"  # paged: every swap came back


def test_paged_swap_of_a_request_that_ends_while_swapped_frees_its_host_slots():
    sched, worker = build_mode("paged", num_slots=319, rows=8, host_slots=1024, host_kv_gib=1,
                               preempt="swap", chunk_size=64, schedule_conservativeness=0.0)
    rng = random.Random(4)
    for i in range(6):
        sched.add(make_req(f"r{i}", [rng.randrange(1, 97) for _ in range(50)], 60,
                           ignore_eos=True))

    def abort_swapped(s, _):
        for rid in list(s.kv.swapped):
            s.abort(rid)
    drive(sched, worker, on_step=abort_swapped)
    assert sched.num_swaps > 0 and not sched.kv.swapped
    assert sched.kv.host.swapped == 0 and sched.kv.stats().host.used == 0


@pytest.mark.parametrize("bad", [{"host_kv_gib": -1}, {"preempt": "drop"},
                                 {"preempt": "swap"}, {"kv": "contiguous", "host_kv_gib": 1}])
def test_bad_host_tier_options_are_refused(bad):
    with pytest.raises(ConfigError):
        ServerConfig(ipc_dir="/tmp", **bad)

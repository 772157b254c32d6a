"""Compressed-entry ids in the token layout (`EntryIds`, DeepSeek-V4's windows of 4 and 8
tokens): handed out with the slots of the positions closing windows and freed with them,
exactly once, whoever holds the slot; a radix split keeps each id with its slot; ids that
run short evict cached prefixes (or refuse admission when running requests hold them);
a prefix hit sends its prefix's ids; the host tier copies ids with their slots. Through
the scheduler, every window a step's tokens read has, in the worker's tables the plans
build, the id its closing slot holds."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from runtime.scheduler.entry_ids import EntryIds, paged_entry_ids
from runtime.scheduler.host_tier import HostTier
from runtime.scheduler.paged_kv import PagedKV
from runtime.scheduler.req import Req
from runtime.scheduler.row_pool import AllocatorError
from runtime.scheduler.token_kv import TokenKV
from tests.scheduler.fake_worker import drive, make_req
from tests.scheduler.kv_modes import build_mode, grow
from tests.scheduler.test_scheduler import check_against_reference, collect

ALIGN, REPLAY = 8, 4  # the tiny V4's prefix rule: rates 4 and 8, its CSA window replayed


def token_kv(slots: int = 64, ids: dict[int, int] | None = None,
             host: int = 0) -> TokenKV:
    """A token layout of `slots` slots handing out `ids` (and a host tier of `host`)."""
    entries = EntryIds(slots, ids or {4: 16, 8: 8})
    tier = HostTier(host, 0, EntryIds(host, {4: 16, 8: 8}), entries.ids_of) if host else None
    kv = TokenKV(slots, 8, tier, entries)
    kv.prefix_align, kv.prefix_replay = ALIGN, REPLAY
    return kv


def admitted(kv: TokenKV, rid: str, prompt: list[int], n: int) -> Req:
    """`rid` admitted and grown by its first `n` positions past its cached prefix."""
    req = Req(make_req(rid, prompt, 4))
    assert kv.admit(req) and kv.can_admit(req, n)
    grow(kv, req, n)
    return req


def ids_of(kv: TokenKV, slots: np.ndarray, m: int) -> list[int]:
    return kv.entries.of_slot[m][slots].tolist()


def test_ids_go_with_the_slots_that_close_windows_and_come_back_once():
    kv = token_kv()
    a = admitted(kv, "a", list(range(1, 21)), 10)
    # positions 3 and 7 close windows of 4, position 7 one of 8: ids from 1 up
    assert a.entry_writes == [(4, 0, [1, 2]), (8, 0, [1])]
    grow(kv, a, 9)  # positions 10..18: windows 2, 3 of 4 (positions 11, 15), 1 of 8 (15)
    assert a.entry_writes[2:] == [(4, 2, [3, 4]), (8, 1, [2])]
    slots = a.slots[: a.kv_len]
    assert ids_of(kv, slots, 4) == [0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0]
    kv.check_invariants([a])
    kv.truncate(a, 14)  # gives back positions 14..18: the id of window 3 of 4, 1 of 8
    assert (kv.entries.pools[4].available, kv.entries.pools[8].available) == (13, 7)
    kv.release(a, cache=True)  # the tree holds positions 0..13 and ids 1..3, 1
    kv.check_invariants([])
    assert kv.entries.evictable == {4: 3, 8: 1}
    assert kv.flush_cache() == 14
    assert (kv.entries.pools[4].available, kv.entries.pools[8].available) == (16, 8)
    assert kv.entries.evictable == {4: 0, 8: 0}
    kv.check_invariants([])
    with pytest.raises(AllocatorError, match="double free"):
        kv.entries.pools[4].free(np.array([1]))  # every id came back already


def test_a_split_keeps_each_id_with_its_slot():
    kv = token_kv()
    prompt = list(range(1, 14))
    a = admitted(kv, "a", prompt, 12)
    slots = a.slots[:12].copy()
    kv.release(a, cache=True)
    # a match ending at 6 splits the node: window 0's id in the upper half, 1 and 2 below
    upper, node = kv.cache.match_prefix(prompt[:6])
    assert len(node.key) == 6 and ids_of(kv, upper, 4) == [0, 0, 0, 1, 0, 0]
    kv.check_invariants([])  # the evictable counts follow the halves
    kv.cache.inc_lock(node)
    assert kv.entries.evictable == {4: 2, 8: 1}  # the lower half's windows 1, 2 (and 0 of 8)
    kv.cache.evict(6)  # the lower half only: its slots and ids come back, the upper keeps 1
    assert ids_of(kv, slots, 4) == [0, 0, 0, 1] + [0] * 8
    assert kv.entries.pools[4].available == 15 and kv.entries.pools[8].available == 8
    kv.cache.dec_lock(node)
    kv.check_invariants([])


def test_ids_short_evict_cached_prefixes_and_refuse_what_running_requests_hold():
    kv = token_kv(slots=64, ids={4: 4, 8: 2})  # 64 slots, ids for 16 positions
    a = admitted(kv, "a", list(range(1, 18)), 16)  # all 4 ids of rate 4, both of 8
    kv.release(a, cache=True)
    b = Req(make_req("b", list(range(50, 70)), 4))  # nothing in common
    assert kv.admit(b) and kv.can_admit(b, 8)  # the cached prefix's ids can be evicted
    assert kv.allocator.available == 48 and kv.entries.pools[4].available == 0
    grow(kv, b, 8)  # evicts it for the ids, though 48 slots were free
    assert kv.cache.total_cached == 0 and b.entry_writes == [(4, 0, [1, 2]), (8, 0, [1])]
    kv.check_invariants([b])
    c = Req(make_req("c", list(range(80, 99)), 4))
    assert kv.admit(c) and kv.can_admit(c, 8)  # the 2 ids b leaves
    assert not kv.can_admit(c, 12)  # a third window of 4: b holds the others
    assert kv.room(c) == 11  # positions 0..10 close two windows of 4
    assert kv.try_alloc(c, 12) is None and kv.allocator.available == 56  # nothing taken
    kv.release(c, cache=False)
    kv.check_invariants([b])


def test_a_prefix_hit_sends_its_prefixes_ids():
    kv = token_kv()
    shared = list(range(1, 20))
    a = admitted(kv, "a", shared + [30], 19)
    kv.release(a, cache=True)
    hit = Req(make_req("hit", shared[:17] + [40, 41], 4))
    assert kv.admit(hit) and hit.cached_len == 16  # aligned to 8: windows 0..3 and 0..1
    assert hit.entry_writes == [(4, 0, [1, 2, 3, 4]), (8, 0, [1, 2])]
    assert kv.entries.evictable == {4: 0, 8: 0}  # locked by the hit
    kv.check_invariants([hit])


def test_the_host_tier_carries_ids_with_their_slots():
    kv = token_kv(host=64)
    prompt = list(range(1, 18))
    a = admitted(kv, "a", prompt, 16)
    kv.release(a, cache=True)
    assert kv.flush_cache() == 16  # written back: host slots and host ids of each window
    orders = kv.take_copies()
    assert {m: (d.tolist(), h.tolist()) for m, (d, h) in orders.entry_writeback.items()} == {
        4: ([1, 2, 3, 4], [1, 2, 3, 4]), 8: ([1, 2], [1, 2])}
    assert (kv.entries.pools[4].available, kv.host.entries.pools[4].available) == (16, 12)
    hit = Req(make_req("hit", prompt[:16] + [90], 4))
    assert kv.admit(hit) and hit.cached_len == 16  # loaded into fresh slots and ids
    orders = kv.take_copies()
    assert {m: (h.tolist(), d.tolist()) for m, (h, d) in orders.entry_load.items()} == {
        4: ([1, 2, 3, 4], [5, 6, 7, 8]), 8: ([1, 2], [3, 4])}
    assert hit.entry_writes == [(4, 0, [5, 6, 7, 8]), (8, 0, [3, 4])]
    kv.check_invariants([hit])


def test_paged_swaps_carry_the_ids_pages_give():
    """Pages of 4: window w of 4 (or 8) closes at a block's last slot, whose page is its
    id on the device; the host gives it a host id of its own with the swapped slot."""
    host = HostTier(64, 0, EntryIds(64, {4: 16, 8: 8}), functools.partial(paged_entry_ids, 4))
    kv = PagedKV(23, 4, 4, host)  # blocks 1..5
    kv.prefix_align, kv.prefix_replay = ALIGN, REPLAY
    a = admitted(kv, "a", list(range(1, 20)), 16)  # blocks of positions 0..15
    pages = [b.block_id for b in kv.tables["a"].blocks]
    assert kv.swap_out(a)
    a.retract()
    out = kv.take_copies().entry_writeback
    assert {m: (d.tolist(), h.tolist()) for m, (d, h) in out.items()} == {
        4: (pages, [1, 2, 3, 4]), 8: (pages[1::2], [1, 2])}
    b = admitted(kv, "b", list(range(50, 70)), 20)  # every block: a's cached ones reused
    kv.release(b, cache=False)
    assert kv.admit(a) and a.cached_len == 16  # its 16 positions loaded into fresh blocks
    fresh = [b.block_id for b in kv.tables["a"].blocks]
    back = kv.take_copies().entry_load
    assert {m: (h.tolist(), d.tolist()) for m, (h, d) in back.items()} == {
        4: ([1, 2, 3, 4], fresh), 8: ([1, 2], fresh[1::2])}
    kv.check_invariants([a])


def mirror_tables(sched, rates=(4, 8)):
    """A worker's entry tables built from each plan's `entry_writes`; checks every plan's
    requests read, for each window their positions close, the id their closing slot holds
    in the scheduler."""
    tables: dict[tuple[int, int, int], int] = {}
    reqs_by_row = {}

    def check(plan) -> None:
        for m, row, first, ids in plan.entry_writes:
            for j, entry in enumerate(ids):
                tables[m, row, first + j] = entry
        for req in sched.running:
            if req.row is not None:
                reqs_by_row[req.row] = req
        for row, pre, ext in zip(plan.rows, plan.prefix_lens, plan.extend_lens):
            req = reqs_by_row[row]
            for m in rates:
                for w in range((pre + ext) // m):
                    slot = int(req.slots[(w + 1) * m - 1])
                    assert tables[m, row, w] == sched.kv.entries.of_slot[m][slot] != 0

    return check


@pytest.mark.parametrize("ids,short,host", [
    ({4: 1000, 8: 1000}, False, {}),
    ({4: 40, 8: 20}, True, {}),
    ({4: 40, 8: 20}, True, dict(host_slots=120, host_kv_gib=1.0)),
])  # fmt: skip
def test_the_plans_ids_are_the_closing_slots_own(ids, short, host):
    """Shared prompts through the scheduler, ids plenty or short (cached prefixes evicted
    for them), with or without a host tier (evicted prefixes written back with their ids,
    loaded back into fresh ones): every window a step reads has the id its slot holds, the
    outputs are the reference's, the invariants hold between steps."""
    sched, worker = build_mode("token", num_slots=200, rows=16, chunk_size=16,
                               prefix_rule=(ALIGN, REPLAY), entry_ids=ids, **host)
    entries, lacking = sched.kv.entries, []
    shortfall = entries.shortfall
    entries.shortfall = lambda needs: lacking.append(shortfall(needs)) or lacking[-1]
    check = mirror_tables(sched)
    run = worker.run
    worker.run = lambda plan: check(plan) or run(plan)
    rng = random.Random(5)
    shared = [rng.randrange(1, 97) for _ in range(40)]
    reqs = [make_req(f"r{i}", shared[: rng.randrange(5, 40)] + [rng.randrange(1, 97)], 12)
            for i in range(24)]
    outs: dict = {}
    for req in reqs:
        sched.add(req)
    drive(sched, worker, on_step=collect(sched, outs))
    check_against_reference(reqs, outs)
    assert sched.kv.stats().prefix_hit_tokens > 0
    assert any(lacking) == short  # growth found ids short (and evicted for them)
    if host:
        assert sched.kv.stats().host.hit_tokens > 0  # prefixes loaded back, ids and all

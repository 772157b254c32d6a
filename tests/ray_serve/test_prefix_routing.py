"""Prefix-aware routing: the map of which replica served which prefix, and the router's
choice among replicas."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from runtime.ray_serve.prefix_map import PrefixMap

BLOCK = 8


def test_the_longest_prefix_wins():
    m = PrefixMap(block_chars=BLOCK)
    shared = "s" * (3 * BLOCK)
    m.insert(shared + "a" * BLOCK, "r1")
    m.insert(shared[:BLOCK] + "b" * (3 * BLOCK), "r2")
    assert m.match(shared + "a" * BLOCK + "tail", ["r1", "r2"]) == (4, {"r1"})
    assert m.match(shared[:BLOCK] + "zzzzzzzzzz", ["r1", "r2"]) == (1, {"r1", "r2"})
    assert m.match(shared + "a" * BLOCK, ["r2"]) == (1, {"r2"})  # only candidates count
    assert m.match("q" * (2 * BLOCK), ["r1", "r2"]) == (0, set())
    assert m.match("s" * (BLOCK - 1), ["r1"]) == (0, set())  # under one block: no key


def test_a_removed_replica_is_forgotten_and_capacity_holds():
    m = PrefixMap(block_chars=BLOCK, capacity=4)
    m.insert("x" * (2 * BLOCK), "r1")
    m.remove("r1")
    assert m.match("x" * (2 * BLOCK), ["r1"]) == (0, set())
    m.insert("y" * (3 * BLOCK), "r1")
    m.insert("z" * (3 * BLOCK), "r2")  # 6 keys > 4: y's oldest blocks go first
    assert m.match("z" * (3 * BLOCK), ["r2"]) == (3, {"r2"})
    assert m.match("y" * (3 * BLOCK), ["r1"]) == (0, set())


def _router(imbalance: int):
    from runtime.ray_serve.router import PrefixAffinityRouter

    router = PrefixAffinityRouter.__new__(PrefixAffinityRouter)  # no Serve machinery
    loads: dict[str, int] = {}
    router.initialize_state(imbalance=imbalance, block_chars=BLOCK)
    # the requests in flight Serve last saw on each replica
    router._replica_queue_len_cache = SimpleNamespace(get=lambda rid: loads.get(rid.unique_id))
    return router, loads


def _replica(name: str):
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=name))


def _pending(prompt: str):
    return SimpleNamespace(args=[SimpleNamespace(prefix_key=prompt)])


@pytest.mark.parametrize("holder_load, expect_affinity", [(3, True), (4, False)])
def test_the_router_prefers_the_prefix_s_replica_unless_it_is_too_busy(holder_load,
                                                                      expect_affinity):
    pytest.importorskip("ray.serve", reason="needs Ray Serve")
    router, loads = _router(imbalance=3)
    a, b, c = _replica("a"), _replica("b"), _replica("c")
    prompt = "p" * (4 * BLOCK)
    router.on_request_routed(_pending(prompt), b.replica_id, None)
    loads.update(a=0, b=holder_load, c=1)
    ranks = asyncio.run(router.choose_replicas([a, b, c], _pending(prompt + "more")))
    assert ranks == ([[b], [a, b, c]] if expect_affinity else [[a, b, c]])
    # a prompt no replica has seen: all of them, the least busy first by Serve's choice
    assert asyncio.run(router.choose_replicas([a, b, c], _pending("n" * 40))) == [[a, b, c]]
    assert asyncio.run(router.choose_replicas([], _pending(prompt))) == []


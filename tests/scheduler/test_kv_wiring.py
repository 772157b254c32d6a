"""KV mode options: CLI and config validation, the manager and scheduling each mode gets,
and the stats snapshot in every mode."""

from __future__ import annotations

import pytest

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.launch.cli import build_parser, config_from_args
from runtime.scheduler.kv_study.contiguous_kv import ContiguousKV
from runtime.scheduler.kv_study.dynamic_kv import DynamicPagedKV
from runtime.scheduler.loop import stats
from runtime.scheduler.paged_kv import PagedKV
from runtime.scheduler.policy import preempt_order, retract_order
from runtime.scheduler.token_kv import TokenKV
from tests.scheduler.fake_worker import drive, make_req
from tests.scheduler.kv_modes import build_mode


def parse(*flags: str) -> ServerConfig:
    return config_from_args(build_parser().parse_args(["serve", *flags]))


def test_cli_block_size_reserve_and_overlap():
    dynamic = parse("--kv", "paged", "--block-size", "dynamic").kv_mode
    assert dynamic.kind == "dynamic" and dynamic.page_size == 1 and not dynamic.overlap
    assert not dynamic.serving and not dynamic.prefix_cache
    paged = parse("--kv", "paged", "--block-size", "32").kv_mode
    assert (paged.kind, paged.page_size, paged.overlap, paged.prefix_cache) == (
        "paged",
        32,
        False,
        True,
    )
    assert parse("--kv", "paged", "--overlap").kv_mode.overlap
    assert not parse("--no-overlap").kv_mode.overlap
    token = parse().kv_mode
    assert (token.kind, token.page_size, token.overlap, token.serving) == ("token", 1, True, True)
    contiguous = parse("--kv", "contiguous", "--reserve", "max").kv_mode
    assert contiguous.reserve == "max" and not contiguous.serving and contiguous.overlap


@pytest.mark.parametrize(
    "bad", [{"block_size": 0}, {"block_size": "big"}, {"block_size": "-4"}, {"reserve": "all"}]
)
def test_invalid_kv_options_are_rejected(bad):
    with pytest.raises(ConfigError):
        ServerConfig(ipc_dir="/tmp", **bad)


@pytest.mark.parametrize(
    "kv, options, manager, in_flight, key",
    [
        ("token", {}, TokenKV, 2, retract_order),
        ("paged", {}, PagedKV, 1, preempt_order),
        ("paged", {"overlap": True}, PagedKV, 2, preempt_order),
        ("paged", {"block_size": "dynamic"}, DynamicPagedKV, 1, preempt_order),
        ("contiguous", {}, ContiguousKV, 2, retract_order),
        ("contiguous", {"overlap": False}, ContiguousKV, 1, retract_order),
    ],
)
def test_each_mode_gets_its_manager_and_scheduling(kv, options, manager, in_flight, key):
    sched, _ = build_mode(kv, **options)
    assert type(sched.kv) is manager
    assert sched.max_in_flight == in_flight and sched.retract_key is key
    assert sched.max_context <= sched.kv.total


@pytest.mark.parametrize(
    "kv, options",
    [("token", {}), ("paged", {}), ("contiguous", {}), ("paged", {"block_size": "dynamic"})],
)
def test_stats_in_every_mode(kv, options):
    sched, worker = build_mode(kv, **options)
    sched.add(make_req("a", list(range(1, 40)), 30, ignore_eos=True))
    launched = sched.plan()
    mid = stats(sched, token=1)
    assert mid.invariant_error is None and mid.running == 1
    assert 0 < mid.kv_held <= mid.kv_used <= mid.kv_total
    assert mid.kv_free + mid.kv_cached + mid.kv_used == mid.kv_total
    sched.on_result(worker.run(launched))
    drive(sched, worker)
    end = stats(sched, token=2)
    assert end.invariant_error is None and end.kv_used == 0 and end.kv_held == 0

"""The host KV tier in /metrics and in the periodic log line."""

from __future__ import annotations

from runtime.api.monitoring.metrics import _stats_metrics
from runtime.api.monitoring.monitor import _host_tier
from runtime.wire.api_input import SchedulerStats


def stats(**kw) -> SchedulerStats:
    return SchedulerStats(token=0, running=1, waiting=0, kv_total=100, kv_free=50, kv_cached=10,
                          kv_used=40, num_steps=5, num_retractions=2, prefix_hit_tokens=60,
                          prefix_query_tokens=100, **kw)


def samples(s: SchedulerStats) -> dict[tuple, float]:
    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for m in _stats_metrics(s) for x in m.samples}


def test_host_tier_usage_traffic_and_hit_rate_per_tier():
    got = samples(stats(host_kv_total=400, host_kv_used=100, host_hit_tokens=15,
                        writeback_bytes=4096, load_bytes=2048, writeback_seconds=0.5,
                        load_seconds=0.25, num_swaps=2))
    assert got[("sluice_host_kv_slots", ())] == 400
    assert got[("sluice_host_kv_usage_ratio", ())] == 0.25
    assert got[("sluice_prefix_cache_tier_hit_rate", (("tier", "device"),))] == 0.45
    assert got[("sluice_prefix_cache_tier_hit_rate", (("tier", "host"),))] == 0.15
    assert got[("sluice_kv_writeback_bytes_total", ())] == 4096
    assert got[("sluice_kv_load_bytes_total", ())] == 2048
    assert got[("sluice_kv_writeback_seconds_total", ())] == 0.5
    assert got[("sluice_kv_load_seconds_total", ())] == 0.25
    assert got[("sluice_swaps_total", ())] == 2


def test_no_host_tier_no_host_metrics_and_a_plain_log_line():
    s = stats()
    assert not any(name.startswith("sluice_host") for name, _ in samples(s))
    assert _host_tier(s) == ""


def test_log_line_shows_host_usage_hits_and_traffic():
    line = _host_tier(stats(host_kv_total=400, host_kv_used=100, host_hit_tokens=15,
                            writeback_bytes=4_000_000, load_bytes=2_000_000,
                            writeback_seconds=0.5, load_seconds=0.25, num_swaps=3))
    assert "(host 15.0%)" in line and "host tier 25.0% (100/400 slots)" in line
    assert "written back 4.0 MB in 0.50 s" in line and "loaded 2.0 MB in 0.25 s" in line
    assert "swaps 3" in line

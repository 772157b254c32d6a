"""/health verdicts: the tracker on scripted stats and clock, and the HTTP front of an api
whose engine dies (TokenizerManager + Monitor + HttpServer on a loop, fake scheduler)."""

from __future__ import annotations

import contextlib

import httpx
import msgspec
import zmq

from runtime.api.http.server import HttpServer
from runtime.api.loop_thread import LoopThread
from runtime.api.monitoring.health import HealthTracker
from runtime.api.monitoring.monitor import Monitor
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.config.server import ServerConfig
from runtime.wire.api_input import SchedulerStats
from runtime.wire.lifecycle import ProcessDied
from tests.api.fake_scheduler import FakeScheduler
from tests.api.http_helpers import wait_until

CFG = ServerConfig(stall_timeout=5.0, kv_alert_ratio=0.9, kv_alert_seconds=10.0,
                   degrade_waiting=4, degrade_max_tokens=32)


def stats(steps: int = 0, running: int = 0, waiting: int = 0, kv_used: int = 0,
          **kw) -> SchedulerStats:
    return SchedulerStats(token=0, running=running, waiting=waiting, kv_total=100,
                          kv_free=100 - kv_used, kv_cached=0, kv_used=kv_used, num_steps=steps,
                          num_retractions=0, prefix_hit_tokens=0, prefix_query_tokens=0, **kw)


def test_ok_then_stalled_when_queued_work_sees_no_step():
    h = HealthTracker(CFG, now=0.0)
    assert h.report(now=0.0).status == "starting"
    h.on_stats(stats(steps=3, running=1, waiting=2), now=1.0)
    assert h.report(now=1.0).http_status == 200
    h.on_stats(stats(steps=3, running=1, waiting=5), now=4.0)
    assert h.report(now=5.9).status == "ok"
    h.on_stats(stats(steps=3, running=1, waiting=6), now=6.5)
    report = h.report(now=6.5)
    assert report.http_status == 503 and "scheduler may be blocked" in report.reasons[0]
    h.on_stats(stats(steps=4, running=1, waiting=6), now=7.0)
    assert h.report(now=7.0).http_status == 200


def test_idle_scheduler_is_never_stalled_but_a_silent_one_is():
    h = HealthTracker(CFG, now=0.0)
    h.on_stats(stats(steps=3), now=1.0)
    h.on_stats(stats(steps=3), now=100.0)
    assert h.report(now=100.0).status == "ok"
    report = h.report(now=106.0)  # no stats reply for 6 s
    assert report.http_status == 503 and "has not answered" in report.reasons[0]


def test_kv_usage_must_stay_high_for_the_configured_time():
    h = HealthTracker(CFG, now=0.0)
    h.on_stats(stats(steps=1, running=1, kv_used=95), now=1.0)
    h.on_stats(stats(steps=2, running=1, kv_used=95), now=10.0)
    assert h.report(now=10.0).status == "ok"
    h.on_stats(stats(steps=3, running=1, kv_used=96), now=11.0)
    report = h.report(now=11.0)
    assert report.http_status == 503 and "KV usage 96% has been above 90%" in report.reasons[0]
    h.on_stats(stats(steps=4, running=1, kv_used=50), now=12.0)
    assert h.report(now=12.0).status == "ok"


def test_degraded_is_200_with_the_reason_and_death_is_503():
    h = HealthTracker(CFG, now=0.0)
    h.on_stats(stats(steps=1, running=1, waiting=4, degraded=True), now=1.0)
    report = h.report(now=1.0)
    assert report.http_status == 200 and report.status == "degraded"
    assert "max_tokens <= 32" in report.reasons[0] and report.to_json()["degraded"] is True
    dead = h.report("the worker process died (exit code 1)", now=1.0)
    assert dead.http_status == 503 and dead.reasons == ["the worker process died (exit code 1)"]


@contextlib.contextmanager
def http_front(cfg: ServerConfig, spec):
    """TokenizerManager, Monitor and HttpServer on a background loop, as in the api process."""
    lt = LoopThread()
    tm = TokenizerManager(cfg, spec)
    monitor = Monitor(tm, cfg)
    http = HttpServer(tm, cfg, monitor)
    lt.run(tm.start())
    lt.run(tm.wait_limits(10))  # as the api process does before serving
    lt.run(monitor.start())
    lt.run(http.start())
    try:
        yield http.url
    finally:
        lt.run(http.close())
        lt.run(monitor.close())
        lt.run(tm.close())
        lt.close()


def test_engine_death_makes_health_and_requests_503(cfg, spec, script_ids):
    cfg = cfg.replace(stats_interval=0.05)
    body = {"model": cfg.model, "prompt": "Hello", "max_tokens": 4}
    with FakeScheduler(cfg, lambda r: script_ids), http_front(cfg, spec) as url:
        ok = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
        status, health = _health(url)
        assert status == 503 and health["status"] == "starting"  # the fake sends no stats

        ctx = zmq.Context()
        sup = ctx.socket(zmq.PUSH)
        sup.connect(cfg.ipc("api_in"))
        sup.send(msgspec.msgpack.encode(ProcessDied("worker", 1)))
        wait_until(lambda: _health(url)[1]["status"] == "unhealthy", what="the death")
        sup.close(linger=0)
        ctx.term()

        status, health = _health(url)
        assert status == 503 and health["reasons"] == ["the worker process died (exit code 1)"]
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert r.status_code == 503 and "worker process died" in r.json()["error"]["message"]


def _health(url: str) -> tuple[int, dict]:
    r = httpx.get(f"{url}/health", timeout=30)
    return r.status_code, r.json()

"""A real server under load: the queue limit (429), priority admission, degraded mode, and
/health for a stalled scheduler and high KV usage.

Pausing the worker (SIGSTOP) freezes the scheduler's steps while it still answers, so
the queue states these tests need are reached deterministically, not by racing a clock.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from runtime.client import Client
from runtime.wire.errors import Overloaded
from tests.api.http_helpers import live_server, sse_json, wait_until

MODEL = "smollm2"
MAX_RUNNING, MAX_QUEUE = 8, 64
DEGRADE_WAITING, DEGRADE_MAX_TOKENS = 8, 4
STALL_S = 5.0


@pytest.fixture(scope="module")
def server():
    with live_server(max_running=MAX_RUNNING, max_queue=MAX_QUEUE, kv_slots=1024,
                     kv_alert_ratio=0.5, kv_alert_seconds=0.0, stall_timeout=STALL_S,
                     degrade_waiting=DEGRADE_WAITING, degrade_max_tokens=DEGRADE_MAX_TOKENS,
                     stats_interval=0.2) as s:
        yield s


def in_scheduler(server) -> int:
    m = server.metrics()
    return int(m["sluice_num_requests_running"] + m["sluice_num_requests_waiting"])


def completion(max_tokens: int, **extra) -> dict:
    return {"model": MODEL, "prompt": "Tell me a story.", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, **extra}


async def until(pred, what: str, timeout: float = 60.0) -> None:
    await asyncio.to_thread(wait_until, pred, timeout, what)


def test_flood_past_max_queue_gets_429_and_accepted_requests_finish(server):
    capacity, flood = MAX_RUNNING + MAX_QUEUE, 100

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=flood + 10)
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as http:
            with server.worker_paused():  # nothing finishes: exactly `capacity` fit
                tasks = [asyncio.create_task(http.post("/v1/completions", json=completion(1)))
                         for _ in range(flood)]
                await until(lambda: sum(t.done() for t in tasks) == flood - capacity,
                            "the requests beyond the queue to be refused")
                assert in_scheduler(server) == capacity
                with pytest.raises(Overloaded, match="queue is full"):  # the RPC equivalent
                    await asyncio.to_thread(_rpc_generate, server.rpc_addr)
                await until(lambda: _stalled(server), "/health to report the stall",
                            timeout=STALL_S + 30)
            return await asyncio.gather(*tasks)

    responses = asyncio.run(run())
    refused = [r for r in responses if r.status_code == 429]
    served = [r for r in responses if r.status_code == 200]
    assert len(refused) == flood - capacity and len(served) == capacity
    err = refused[0].json()["error"]
    assert err["code"] == "server_overloaded" and f"max_queue={MAX_QUEUE}" in err["message"]
    for r in served:
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 1
    wait_until(lambda: server.health()[0] == 200, what="/health to recover")
    assert server.metrics()['sluice_http_errors_total{status="429"}'] >= len(refused)


def _rpc_generate(addr: str) -> None:
    with Client(addr, timeout=30) as client:
        client.generate("Hi", max_tokens=1)


def _stalled(server) -> bool:
    status, body = server.health()
    return status == 503 and any("no scheduler step" in r for r in body["reasons"])


def test_high_priority_request_gets_its_first_token_before_most_queued_ones(server):
    n_low = 64
    first_tokens: list[str] = []

    async def stream(http: httpx.AsyncClient, name: str, priority: int) -> None:
        body = completion(1, stream=True, priority=priority)
        async with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {") and name not in first_tokens:
                    first_tokens.append(name)

    async def run() -> None:
        limits = httpx.Limits(max_connections=n_low + 10)
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as http:
            with server.worker_paused():  # every low-priority request queues first
                tasks = [asyncio.create_task(stream(http, f"low{i}", 0)) for i in range(n_low)]
                await until(lambda: in_scheduler(server) == n_low, "the low requests to queue")
                tasks.append(asyncio.create_task(stream(http, "high", 10)))
                await until(lambda: in_scheduler(server) == n_low + 1, "the high one to queue")
            await asyncio.gather(*tasks)

    asyncio.run(run())
    assert len(first_tokens) == n_low + 1
    assert first_tokens.index("high") < n_low // 2, first_tokens


def test_degraded_mode_caps_max_tokens_and_says_so_in_health(server):
    async def run() -> tuple[dict, dict, dict]:
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as http:
            with server.worker_paused():
                early = asyncio.create_task(http.post("/v1/completions", json=completion(8)))
                await until(lambda: in_scheduler(server) == 1, "the early request")
                fillers = [asyncio.create_task(http.post("/v1/completions", json=completion(1)))
                           for _ in range(16)]
                await until(lambda: server.health()[1].get("degraded"), "degraded mode")
                health = server.health()[1]
                late = asyncio.create_task(http.post("/v1/completions", json=completion(8)))
                await until(lambda: in_scheduler(server) == 18, "the late request")
            await asyncio.gather(*fillers)
            return (await early).json(), (await late).json(), health

    early, late, health = asyncio.run(run())
    assert early["usage"]["completion_tokens"] == 8  # arrived before the queue built up
    assert late["usage"]["completion_tokens"] == DEGRADE_MAX_TOKENS
    assert late["choices"][0]["finish_reason"] == "length"
    assert health["degraded"] is True
    if health["status"] == "degraded":  # (a long pause makes it "unhealthy": stalled)
        assert any("max_tokens <= 4" in r for r in health["reasons"]), health
    wait_until(lambda: server.health()[1]["status"] == "ok", what="/health back to ok")


def test_kv_usage_above_the_alert_ratio_makes_health_503(server):
    prompt = "The quick brown fox jumps over the lazy dog. " * 60  # ~600 of 1024 slots
    body = completion(8, prompt=prompt, stream=True)
    with httpx.Client(base_url=server.url, timeout=300) as http, \
            http.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
        with server.worker_paused():  # the request keeps its KV while we look
            status, health = server.health()
        events, done = sse_json(list(lines))
    assert status == 503 and health["status"] == "unhealthy"
    assert any("KV usage" in r and "above 50%" in r for r in health["reasons"]), health
    assert done
    wait_until(lambda: server.health()[0] == 200, what="/health to recover")


def test_max_tokens_beyond_the_kv_pool_is_a_400_naming_the_limit(server):
    r = httpx.post(f"{server.url}/v1/completions", json=completion(2000), timeout=30)
    assert r.status_code == 400
    assert "context length of 1024 tokens" in r.json()["error"]["message"]

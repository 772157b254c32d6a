"""The load generator's metric math: pure functions on synthetic timestamps (exact), then
the whole client against a fake SSE server that emits tokens at known times (exact too:
both run on a virtual clock)."""

from __future__ import annotations

import asyncio
import json
import math
import random

import aiohttp
import pytest
from aiohttp import web

from bench.serving.data import Burst, RequestSpec, arrival_times, make_dataset
from bench.serving.driver import run_load
from bench.serving.metrics import (
    CANCELLED,
    RequestResult,
    distribution,
    meets_slo,
    parse_slo,
    percentile,
    summarize,
)
from bench.serving.scrape import Scraper, parse_prometheus, step_idle
from tests.bench.virtual_clock import run_virtual


# ------------------------------------------------------------------ pure functions
def test_percentile_interpolates_linearly_like_numpy():
    assert percentile([3, 1, 2, 4], 50) == 2.5
    assert percentile(list(range(1, 11)), 90) == pytest.approx(9.1)
    assert percentile([0, 10], 99) == pytest.approx(9.9)
    assert percentile([7], 99) == 7
    assert math.isnan(percentile([], 50))
    xs = [random.Random(0).random() for _ in range(101)]
    assert percentile(xs, 90) == sorted(xs)[90]  # an exact rank: no interpolation


def _result(ttft: float, gaps: list[float], tokens: list[int] | None = None,
            prompt: int = 10) -> RequestResult:
    """A finished request whose chunks arrived at ttft, ttft + gaps[0], ... (start 100 s)."""
    r = RequestResult(prompt, start=100.0)
    t = 100.0 + ttft
    tokens = tokens or [1] * (len(gaps) + 1)
    r.on_chunk(t, tokens[0])
    for gap, k in zip(gaps, tokens[1:]):
        t += gap
        r.on_chunk(t, k)
    r.ok = True
    return r


def test_request_timings_from_chunks():
    r = _result(0.5, [0.1, 0.2], tokens=[1, 2, 1])  # 4 tokens in 3 chunks
    assert r.ttft == pytest.approx(0.5)
    assert r.latency == pytest.approx(0.8)
    assert r.itl == pytest.approx([0.1, 0.2])  # one gap per chunk, as vLLM counts
    assert r.output_len == 4 and r.chunks == 3
    assert r.tpot == pytest.approx((0.8 - 0.5) / 3)
    r.on_chunk(200.0, 0)  # a chunk without tokens (finish only) changes nothing
    assert r.latency == pytest.approx(0.8) and r.output_len == 4
    assert _result(0.3, []).tpot is None  # one token: no TPOT


def test_summary_matches_hand_computed_values():
    a = _result(0.1, [0.05, 0.05, 0.05], prompt=100)  # 4 tokens, E2E 0.25, TPOT 0.05
    b = _result(0.3, [0.1], prompt=50)  # 2 tokens, E2E 0.4, TPOT 0.1
    failed = RequestResult(20, error="HTTP 429: queue full")
    cut = RequestResult(30, error=CANCELLED)
    s = summarize([a, b, failed, cut], duration=2.0, slo_ms={"ttft": 200, "tpot": 80})
    assert (s["completed"], s["failed"], s["unfinished"]) == (2, 1, 1)
    assert s["total_input_tokens"] == 150 and s["total_output_tokens"] == 6
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(3.0)
    assert s["total_token_throughput"] == pytest.approx(78.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["ttft_ms"]["p90"] == pytest.approx(100 + 0.9 * 200)
    assert s["ttft_ms"]["p99"] == pytest.approx(100 + 0.99 * 200)
    assert s["tpot_ms"]["mean"] == pytest.approx(75.0)
    assert s["e2e_ms"]["p50"] == pytest.approx(325.0)
    assert s["itl_ms"]["mean"] == pytest.approx((50 * 3 + 100) / 4)  # gaps 50, 50, 50, 100
    assert s["itl_ms"]["p99"] == pytest.approx(50 + 0.97 * 50)
    assert s["good_requests"] == 1 and s["goodput"] == pytest.approx(0.5)  # b: TTFT 300 ms
    assert s["errors"] == ["HTTP 429: queue full"]


def test_slo_and_distribution_edges():
    one = _result(0.05, [])
    assert meets_slo(one, {"tpot": 1.0})  # no TPOT with one token: met
    assert not meets_slo(one, {"e2e": 10.0})
    assert not meets_slo(RequestResult(5), {})  # not completed
    assert parse_slo("ttft:500, tpot:50") == {"ttft": 500.0, "tpot": 50.0}
    with pytest.raises(ValueError):
        parse_slo("latency:5")
    d = distribution([0.1, 0.2, 0.3, 0.4])
    assert d == pytest.approx({"mean": 250.0, "p50": 250.0, "p90": 370.0, "p99": 397.0})


def test_arrivals_poisson_gamma_and_bursts():
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]
    t = arrival_times(4000, 10.0, seed=1)
    assert t[0] == 0.0 and all(b >= a for a, b in zip(t, t[1:]))
    assert (t[-1] / (len(t) - 1)) == pytest.approx(0.1, rel=0.05)  # mean gap 1 / rate
    g = arrival_times(4000, 10.0, burstiness=0.25, seed=1)
    gaps = [b - a for a, b in zip(g, g[1:])]
    mean = sum(gaps) / len(gaps)
    cv2 = sum((x - mean) ** 2 for x in gaps) / len(gaps) / mean**2
    assert mean == pytest.approx(0.1, rel=0.1) and cv2 == pytest.approx(4.0, rel=0.25)
    b = arrival_times(3000, 10.0, bursts=(Burst.parse("5:2:5"),), seed=2)
    inside = sum(1 for x in b if 5 <= x < 7)
    before = sum(1 for x in b if 1 <= x < 5) / 4 * 2  # arrivals in 2 s at the base rate
    assert inside / before == pytest.approx(5.0, rel=0.3)


def test_datasets():
    mixed = make_dataset("mixed", 2000, 32000, seed=0, output_len=256, max_len=8192)
    lengths = [len(s.prompt) + s.max_tokens for s in mixed]
    shares = [sum(1 for n in lengths if lo <= n < hi) / len(lengths)
              for lo, hi in ((0, 512), (512, 2048), (2048, 8193))]
    assert shares == pytest.approx([0.3, 0.6, 0.1], abs=0.04)
    assert max(lengths) <= 8192 and all(s.max_tokens <= 256 for s in mixed)
    assert all(s.stop_after is None or 1 <= s.stop_after < s.max_tokens for s in mixed)
    assert sum(s.stop_after is not None for s in mixed) > 0.9 * len(mixed)
    assert all(3 <= t < 32000 for s in mixed[:50] for t in s.prompt)
    fixed = make_dataset("fixed", 3, 1000, seed=0, input_len=7, output_len=5)
    assert [(len(s.prompt), s.max_tokens) for s in fixed] == [(7, 5)] * 3
    shared = make_dataset("shared-prefix", 6, 1000, seed=0, input_len=4, output_len=2,
                          num_prefixes=2, prefix_len=10)
    assert shared[0].prompt[:10] == shared[2].prompt[:10] != shared[1].prompt[:10]
    assert len(shared[0].prompt) == 14
    assert make_dataset("fixed", 2, 1000, seed=1)[0].prompt != fixed[0].prompt


def test_step_idle_from_a_step_log(tmp_path):
    path = tmp_path / "steps.jsonl"
    lines = [{"gap_ms": None, "step_ms": 9.0, "batch_size": 1, "decode": False},
             {"gap_ms": 500.0, "step_ms": 10.0, "batch_size": 4, "decode": False},  # skipped
             {"gap_ms": 1.0, "step_ms": 10.0, "batch_size": 4, "decode": True},
             {"gap_ms": 0.0, "step_ms": 20.0, "batch_size": 8, "decode": True},
             {"gap_ms": 3.0, "step_ms": 6.0, "batch_size": 2, "decode": True}]
    text = "".join(json.dumps(x) + "\n" for x in lines)
    path.write_text(text)
    offset = len("".join(json.dumps(x) + "\n" for x in lines[:1]))
    s = step_idle(path, offset)
    assert s["steps"] == 3 and s["idle_ms"] == 4.0 and s["busy_ms"] == 36.0
    assert s["idle_fraction"] == pytest.approx(0.1)
    assert s["gap_ms_p50"] == 1.0 and s["decode_batch_mean"] == pytest.approx(14 / 3)
    assert step_idle(tmp_path / "missing.jsonl") == {}


def test_prometheus_parsing():
    text = ('# HELP x\nsluice_kv_slots 100.0\nsluice_requests_total{outcome="abort"} 3.0\n'
            'sluice_requests_created{outcome="abort"} 1.7e9\n')
    assert parse_prometheus(text) == {"sluice_kv_slots": 100.0,
                                      'sluice_requests_total{outcome="abort"}': 3.0}


# ------------------------------------------------------------------ a fake server
# The client and the fake server share one event loop on a virtual clock, over a unix
# socket (`tests/bench/virtual_clock.py`): time passes only while both wait, so the
# client's timestamps are the server's schedule exactly. Times are binary fractions, so
# sums of them are exact too.
TTFT, GAP = 0.25, 0.125  # seconds of loop time
CHUNKS = [1, 1, 2, 1]  # tokens per chunk: 5 tokens, first at TTFT, then one chunk per GAP
SCRAPE = 0.3  # the scrape interval: never at a chunk's time (a multiple of 1/8 s)


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class FakeServer:
    """`/v1/completions` streaming CHUNKS on a fixed schedule; `/metrics` with a KV peak.

    max_tokens 429 answers HTTP 429; max_tokens 99 waits 30 s before its first token."""

    def __init__(self) -> None:
        self.in_flight = self.peak_in_flight = self.disconnects = self.scrapes = 0
        self.bodies: list[dict] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if body["max_tokens"] == 429:
            return web.json_response({"error": {"message": "queue full"}}, status=429)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        loop = asyncio.get_running_loop()
        t0 = loop.time() + (30.0 if body["max_tokens"] == 99 else 0.0)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i, k in enumerate(CHUNKS):
                await asyncio.sleep(t0 + TTFT + i * GAP - loop.time())
                await resp.write(_sse({"choices": [{"index": 0, "text": "", "logprobs": {
                    "tokens": ["7"] * k}, "finish_reason": "length" if i == 3 else None}]}))
            await resp.write(_sse({"choices": [], "usage": {"completion_tokens": sum(CHUNKS)}}))
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnects += 1
            raise
        finally:
            self.in_flight -= 1
        return resp

    async def metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        busy = self.in_flight > 0
        text = (f"sluice_kv_slots 1000.0\nsluice_kv_slots_reserved {200.0 if busy else 0.0}\n"
                f"sluice_kv_tokens_held {150.0 if busy else 0.0}\n"
                f"sluice_num_requests_running {float(self.in_flight)}\n"
                f"sluice_retractions_total {float(self.scrapes)}\n")
        return web.Response(text=text)


def _with_server(fn, tmp_path):
    """`fn(url, connector)` against a FakeServer on a unix socket, on a virtual clock."""
    async def go():
        fake = FakeServer()
        app = web.Application()
        app.router.add_post("/v1/completions", fake.completions)
        app.router.add_get("/metrics", fake.metrics)
        runner = web.AppRunner(app, handler_cancellation=True)  # a hang-up cancels a handler
        await runner.setup()
        path = str(tmp_path / "fake.sock")
        await web.UnixSite(runner, path).start()
        try:
            return fake, await fn("http://fake", aiohttp.UnixConnector(path, limit=0))
        finally:
            await runner.cleanup()

    return run_virtual(go())


def _specs(n: int, max_tokens: int = 5, stop_after: int | None = None) -> list[RequestSpec]:
    return [RequestSpec([5, 6, 7], max_tokens, stop_after) for _ in range(n)]


def test_client_measures_the_fake_servers_schedule(tmp_path):
    async def go(url, connector):
        return await run_load(url, "m", _specs(4), concurrency=2, progress=False,
                              scrape_interval=SCRAPE, kv_bytes_per_token=10,
                              connector=connector)

    fake, run = _with_server(go, tmp_path)
    assert fake.peak_in_flight == 2  # the concurrency limit held
    assert fake.bodies[0]["stream"] and fake.bodies[0]["logprobs"] == 0
    assert fake.bodies[0]["prompt"] == [5, 6, 7] and fake.bodies[0]["ignore_eos"]
    e2e = TTFT + 3 * GAP
    for r in run.results:
        assert r.ok and r.output_len == 5 and r.chunks == 4
        assert (r.ttft, r.latency, r.itl) == (TTFT, e2e, [GAP] * 3)
        assert r.tpot == 3 * GAP / 4
    assert [r.start for r in run.results] == [0.0, 0.0, e2e, e2e]  # two waves of two
    assert run.duration == 2 * e2e
    rep = run.report({"ttft": 1000 * TTFT})  # met exactly: a limit, not a bound
    c = rep["client"]
    assert c["completed"] == 4 and c["total_output_tokens"] == 20
    assert c["output_throughput"] == 20 / run.duration
    assert c["tpot_ms"]["p99"] == pytest.approx(750 * GAP)
    assert c["tokens_per_chunk"] == 1.25
    assert c["goodput"] == 4 / run.duration
    s = rep["server"]
    # scrapes at 0 (before), 0.3, 0.6, 0.9, 1.2 (both waves in flight at each) and 1.25
    assert s["samples"] == 6 and fake.scrapes == 6
    assert s["peak_kv_reserved_slots"] == 200 and s["memory_efficiency_at_peak"] == 0.75
    assert s["peak_kv_reserved_bytes"] == 2000 and s["peak_running"] == 2
    assert s["retractions"] == 5  # a counter's increase over the run
    assert run.truncated is False


def test_early_stop_errors_and_deadline(tmp_path):
    async def go(url, connector):
        specs = _specs(1, stop_after=2) + _specs(1, max_tokens=429) + _specs(1, max_tokens=99)
        return await run_load(url, "m", specs, concurrency=3, deadline=1.0, progress=False,
                              connector=connector)

    fake, run = _with_server(go, tmp_path)
    early, refused, slow = run.results
    assert early.ok and early.stopped_early and early.output_len == 2
    assert early.latency == TTFT + GAP
    assert not refused.ok and refused.error.startswith("HTTP 429")
    assert not slow.ok and slow.error == CANCELLED and slow.ttft is None
    assert run.truncated and run.duration == 1.0
    c = run.report()["client"]
    assert (c["completed"], c["failed"], c["unfinished"], c["stopped_early"]) == (1, 1, 1, 1)
    assert fake.disconnects == 2  # the early stop and the cut-off request hung up


def test_scraper_without_a_server_reports_errors(tmp_path):
    """Nothing listens at a unix path that does not exist: every scrape fails at once."""
    async def go():
        connector = aiohttp.UnixConnector(str(tmp_path / "nothing-here.sock"))
        async with aiohttp.ClientSession(connector=connector) as s:
            sc = Scraper(s, "http://nowhere", interval=0.25)
            await sc.start()
            await asyncio.sleep(1.1)
            await sc.stop()
            return sc.summary()

    s = run_virtual(go())
    assert s == {"scrape_errors": 6}  # at 0, 0.25, 0.5, 0.75, 1.0, and at the stop

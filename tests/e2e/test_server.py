"""`sluice serve` end to end: RPC streaming, idle cost, and dying cleanly when a process dies."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from runtime.client import Client
from runtime.wire.errors import InvalidRequest
from tests.e2e.server import ServerProcess, kill_mid_stream


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--chunk-size", "128")
    yield srv
    srv.stop()


def test_rpc_streams_equal_whole_results_for_32_concurrent_requests(server):
    prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(32)]
    results: dict[int, tuple] = {}

    def run(i: int) -> None:
        with Client(server.rpc_addr, timeout=120) as client:
            kw = dict(max_tokens=3 + (i * 5) % 29, temperature=0.0)
            chunks = list(client.generate(prompts[i], stream=True, **kw))
            whole = client.generate(prompts[i], stream=False, **kw)
            results[i] = (chunks, whole)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(results) == 32
    for chunks, whole in results.values():
        assert "".join(c.text for c in chunks) == whole.text
        assert [t for c in chunks for t in c.token_ids] == whole.token_ids
        assert chunks[-1].finish_reason == whole.finish_reason in ("stop", "length")


def test_port_0_takes_free_ports_and_the_serving_line_names_them(server):
    """`ServerProcess` runs `sluice serve --port 0 --rpc-port 0`: the launcher's line names
    the ports the api bound, and the server answers there (no port picked before it)."""
    assert 0 not in (server.port, server.rpc_port)
    line = next(x for x in server.lines if "serving smollm2:" in x)
    assert line.rstrip().endswith(f"serving smollm2: http://127.0.0.1:{server.port}, "
                                  f"rpc tcp://127.0.0.1:{server.rpc_port}")
    assert httpx.get(f"{server.http_url}/health", timeout=10).status_code == 200
    with Client(server.rpc_addr, timeout=60) as client:
        assert client.model_info().model == "smollm2"


def test_bad_rpc_requests_get_errors_and_the_server_keeps_serving(server):
    with Client(server.rpc_addr, timeout=60) as client:
        with pytest.raises(InvalidRequest):
            client.generate("", max_tokens=4)
        with pytest.raises(InvalidRequest):
            client.generate("hi", max_tokens=4, top_p=0.0)
        out = client.generate("Hello", max_tokens=3, temperature=0.0)
        assert len(out.token_ids) == 3


def test_idle_server_uses_under_5_percent_of_a_core(server):
    before, t0 = server.cpu_seconds(), time.monotonic()
    time.sleep(3.0)  # measuring idle CPU needs an interval; nothing is asserted on wall time
    used = server.cpu_seconds() - before
    assert used / (time.monotonic() - t0) < 0.05, f"{used:.2f} CPU-s in 3 s idle"


def test_killing_the_worker_fails_requests_and_exits_nonzero():
    srv = ServerProcess("--chunk-size", "128")
    try:
        kill_mid_stream(srv, "worker", "Tell me a long story.", 30)
    finally:
        srv.stop()

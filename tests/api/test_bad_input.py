"""Bad input gets the caller's error, never a server error or silence: bodies over
`--max-request-bytes` (413, and no RPC reply), JSON or msgpack nested too deeply, ints
outside 64 bits, too many stop strings, and a client leaving while it uploads.
The api runs in this process (uvicorn, RPC server) over a fake scheduler."""

from __future__ import annotations

import logging

import httpx
import msgspec
import pytest
import zmq

from runtime.api.http.app import build_app
from runtime.api.loop_thread import LoopThread
from runtime.api.monitoring.monitor import Monitor
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.wire.request_output import RequestOutput
from runtime.wire.rpc import RpcError, RpcGenerate, RpcOutput
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from tests.api.fake_scheduler import FakeScheduler
from tests.api.http.test_health import http_front
from tests.api.rpc.test_server import raw_dealer, serving

LIMIT = 4096  # --max-request-bytes of these tests
BIG = 1 << 64  # over int64 (and over msgpack's uint64 for RPC: 2**63 below)
DEEP = b"[" * 1500 + b"]" * 1500  # Python's recursion limit is 1000


@pytest.fixture
def small_cfg(cfg):
    return cfg.replace(max_request_bytes=LIMIT)


def completion(**extra) -> dict:
    return {"model": "smollm2", "prompt": "Hi", "max_tokens": 2, **extra}


BAD = [
    ("/v1/completions", completion(seed=BIG), "seed"),
    ("/v1/completions", completion(top_k=BIG), "top_k"),
    ("/v1/completions", completion(priority=-BIG), "priority"),
    ("/v1/completions", completion(stop=[f"s{i}" for i in range(17)]), "at most 16 stop"),
    ("/v1/completions", completion(stop=["x" * 600, "y" * 600]), "1024 characters"),
    ("/v1/chat/completions", {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
                              "seed": BIG}, "seed"),
    ("/generate", {"text": "Hi", "sampling_params": {"seed": BIG}}, "seed"),
    ("/generate", {"text": "Hi", "sampling_params": {"top_k": BIG}}, "top_k"),
    ("/generate", {"text": "Hi", "priority": BIG}, "priority"),
    ("/generate", {"text": "Hi", "logprob_start_len": BIG}, "logprob_start_len"),
    ("/generate", {"text": "Hi", "sampling_params": {"top_logprobs": 21}}, "top_logprobs"),
    ("/generate", {"text": "Hi", "sampling_params": {"json_schema": "{not json"}},
     "invalid json_schema"),
    ("/generate", {"text": "Hi", "sampling_params": {"regex": "a+", "json_schema": "{}"}},
     "at most one of regex and json_schema"),
    ("/v1/chat/completions", {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "x"}}}, "schema"),
    ("/v1/completions", b'{"model": "smollm2", "prompt": ' + DEEP + b"}", "nested too deeply"),
    ("/v1/chat/completions", b'{"model": "smollm2", "tools": ' + DEEP + b"}", "nested too deeply"),
    ("/generate", b'{"text": "Hi", "sampling_params": {"stop": ' + DEEP + b"}}",
     "nested too deeply"),
]  # fmt: skip

JSON = {"Content-Type": "application/json"}


def test_bad_input_is_a_400_over_http(small_cfg, spec, script_ids):
    with (
        FakeScheduler(small_cfg, lambda r: script_ids) as fake,
        http_front(small_cfg, spec) as url,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        for path, body, needle in BAD:
            r = http.post(
                path, **({"content": body} if isinstance(body, bytes) else {"json": body}),
                headers=JSON,
            )
            assert r.status_code == 400, (path, body, r.text)
            assert needle in r.json()["error"]["message"], (needle, r.text)
        assert http.post("/v1/completions", json=completion()).status_code == 200
        metrics = http.get("/metrics").text
    assert len(fake.of_type(GenerateReq)) == 1
    assert f'sluice_http_errors_total{{status="400"}} {len(BAD)}.0' in metrics
    assert 'status="500"' not in metrics


def test_a_body_over_the_limit_is_a_413_by_length_or_by_stream(small_cfg, spec, script_ids):
    fits = completion(prompt="x" * (LIMIT - 200))
    over = completion(prompt="x" * LIMIT)

    def chunked(body: dict):  # no Content-Length: the limit applies while reading
        data = msgspec.json.encode(body)
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    with (
        FakeScheduler(small_cfg, lambda r: script_ids) as fake,
        http_front(small_cfg, spec) as url,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        for r in (
            http.post("/v1/completions", json=over),
            http.post("/v1/completions", content=chunked(over), headers=JSON),
            http.post("/generate", content=b"{" + b" " * (1 << 20) + b"}", headers=JSON),
        ):
            assert r.status_code == 413, r.text
            assert f"over {LIMIT} bytes" in r.json()["error"]["message"]
        assert http.post("/v1/completions", json=fits).status_code == 200
        assert http.post("/v1/completions", content=chunked(fits), headers=JSON).status_code == 200
    assert len(fake.of_type(GenerateReq)) == 2


def test_the_default_body_limit_follows_the_context_length(cfg):
    assert cfg.request_bytes_limit(8192) == 1 << 20  # at least 1 MiB
    assert cfg.request_bytes_limit(131072) == 64 * 131072
    assert cfg.replace(max_request_bytes=5000).request_bytes_limit(131072) == 5000


def test_a_client_leaving_during_its_upload_is_no_server_error(cfg, spec, script_ids, caplog):
    """The body stops half way: the client disconnected (HTTP 499, nobody reads it)."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
    }
    messages = [
        {"type": "http.request", "body": b'{"model": "smollm2", ', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    lt = LoopThread()
    tm = TokenizerManager(cfg, spec)
    with FakeScheduler(cfg, lambda r: script_ids), caplog.at_level(logging.INFO):
        lt.run(tm.start())
        lt.run(tm.wait_limits(10))
        monitor = Monitor(tm, cfg)
        try:
            lt.run(build_app(tm, cfg, monitor)(scope, receive, send))
        finally:
            lt.run(tm.close())
            lt.close()
    assert sent[0]["status"] == 499
    assert "sluice_http_errors_total{" not in monitor.metrics.render().decode()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_bad_rpc_messages_get_an_rpc_error(small_cfg, spec, script_ids):
    dec = msgspec.msgpack.Decoder(RpcOutput)
    deep = b"\x91" * 3000 + b"\xc0"  # [[[...[nil]...]]]
    wide = msgspec.msgpack.encode(["RpcGenerate", "r1", "Hi", {"seed": 1 << 63}])
    with (
        FakeScheduler(small_cfg, lambda r: script_ids),
        serving(small_cfg, spec) as (_, rpc, _lt),
        raw_dealer(rpc.addr) as sock,
    ):
        for payload, rid in ((deep, ""), (wide, "r1")):
            sock.send(payload)
            err = dec.decode(sock.recv())
            assert isinstance(err, RpcError) and err.rid == rid, err
            assert err.kind == "invalid_request" and "malformed message" in err.message


def test_an_rpc_message_over_the_limit_is_dropped_and_serving_goes_on(small_cfg, spec, script_ids):
    dec = msgspec.msgpack.Decoder(RpcOutput)
    params = SamplingParams(max_tokens=2)
    fits = RpcGenerate("fits", "x" * (LIMIT - 100), params, stream=False)
    over = RpcGenerate("over", "x" * LIMIT, params, stream=False)
    with FakeScheduler(small_cfg, lambda r: script_ids) as fake, \
            serving(small_cfg, spec) as (_, rpc, _lt):
        with raw_dealer(rpc.addr) as sock:
            sock.setsockopt(zmq.RCVTIMEO, 500)
            sock.send(msgspec.msgpack.encode(over))
            with pytest.raises(zmq.Again):  # never read, so never answered
                sock.recv()
        with raw_dealer(rpc.addr) as sock:
            sock.send(msgspec.msgpack.encode(fits))
            out = dec.decode(sock.recv())
    assert isinstance(out, RequestOutput) and out.rid == "fits" and out.finish_reason == "length"
    assert len(fake.of_type(GenerateReq)) == 1  # the server's own rid, not the client's

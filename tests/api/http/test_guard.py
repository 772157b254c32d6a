"""The api's fronts on loopback against hostile or careless clients: the API key on HTTP and
RPC, cross-site POSTs, DNS rebinding, slow and surplus connections, and what a client
chosen rid or the prefix cache can leak (fake scheduler, real sockets)."""

from __future__ import annotations

import logging
import shutil
import socket

import httpx
import pytest

from runtime.api.auth import warn_if_exposed
from runtime.api.http.guard import allowed_hosts
from runtime.api.rid import MAX_RID_LEN, loggable
from runtime.client import Client
from runtime.launch.cli import build_parser, config_from_args
from runtime.wire.errors import Unauthorized
from runtime.wire.scheduler_input import GenerateReq
from tests.api.fake_scheduler import FakeScheduler
from tests.api.front_helpers import fronts
from tests.api.http_helpers import wait_until

KEY = "s3cret-key"
SOCKET_BOUND_S = 30.0  # a bound on waiting for the server, never a timing assertion


def completion(**extra) -> dict:
    return {"model": "smollm2", "prompt": "Hello", "max_tokens": 4, **extra}


def test_api_key_guards_every_http_route_but_health(cfg, spec, script_ids):
    cfg = cfg.replace(api_key=KEY)
    good = {"Authorization": f"Bearer {KEY}"}
    with (
        FakeScheduler(cfg, lambda r: script_ids),
        fronts(cfg, spec) as f,
        httpx.Client(base_url=f.url, timeout=30) as http,
    ):
        for method, path, body in [
            ("POST", "/v1/completions", completion()),
            ("POST", "/generate", {"text": "Hi"}),
            ("GET", "/v1/models", None),
            ("GET", "/metrics", None),
            ("GET", "/get_model_info", None),
        ]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                r = http.request(method, path, json=body, headers=headers)
                assert r.status_code == 401, (path, headers)
                assert r.json()["error"]["code"] == "invalid_api_key"
                assert r.headers["www-authenticate"] == "Bearer"
            assert http.request(method, path, json=body, headers=good).status_code == 200
        assert http.get("/health").status_code in (200, 503)  # no key needed: never 401
        r = http.post("/v1/completions", json=completion(), headers=good)
        assert r.json()["usage"]["completion_tokens"] == 4


def test_api_key_guards_rpc(cfg, spec, script_ids, monkeypatch):
    cfg = cfg.replace(api_key=KEY)
    monkeypatch.delenv("SLUICE_API_KEY", raising=False)
    with FakeScheduler(cfg, lambda r: script_ids) as fake, fronts(cfg, spec) as f:
        for key in (None, "wrong"):
            with Client(f.rpc_addr, timeout=30, api_key=key) as client:
                with pytest.raises(Unauthorized, match="API key"):
                    client.generate("Hi", max_tokens=3)
                with pytest.raises(Unauthorized):
                    client.model_info()
        assert not fake.of_type(GenerateReq)  # nothing unauthorized reached the scheduler
        with Client(f.rpc_addr, timeout=30, api_key=KEY) as client:
            assert len(client.generate("Hi", max_tokens=3).token_ids) == 3
        monkeypatch.setenv("SLUICE_API_KEY", KEY)
        with Client(f.rpc_addr, timeout=30) as client:  # the key from the environment
            assert client.model_info().model == cfg.model


def test_post_needs_a_json_content_type(cfg, spec, script_ids):
    body = httpx.Request("POST", "/", json=completion()).content
    with (
        FakeScheduler(cfg, lambda r: script_ids) as fake,
        fronts(cfg, spec) as f,
        httpx.Client(base_url=f.url, timeout=30) as http,
    ):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {} if ctype is None else {"Content-Type": ctype}
            r = http.post("/v1/completions", content=body, headers=headers)
            assert r.status_code == 415, ctype
            assert r.json()["error"]["code"] == "unsupported_media_type"
        assert not fake.of_type(GenerateReq)
        r = http.post(
            "/v1/completions",
            content=body,
            headers={"Content-Type": "Application/JSON; charset=utf-8"},
        )
        assert r.status_code == 200


def test_host_header_must_name_this_server(cfg, spec, script_ids):
    cfg = cfg.replace(allowed_hosts="api.example.com")
    with (
        FakeScheduler(cfg, lambda r: script_ids),
        fronts(cfg, spec) as f,
        httpx.Client(base_url=f.url, timeout=30) as http,
    ):
        for host in ("attacker.example", "127.0.0.1.attacker.example", "example.com"):
            r = http.get("/v1/models", headers={"Host": f"{host}:{f.port}"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", host
        for host in (
            f"localhost:{f.port}",
            f"127.0.0.1:{f.port}",
            f"[::1]:{f.port}",
            "API.example.com",
            "api.example.com.:443",
        ):
            assert http.get("/v1/models", headers={"Host": host}).status_code == 200, host


def test_any_host_on_a_wildcard_address_without_allowed_hosts(cfg):
    assert allowed_hosts(cfg.replace(host="0.0.0.0")) is None
    assert allowed_hosts(cfg.replace(allowed_hosts="*")) is None
    assert "a.example" in allowed_hosts(cfg.replace(host="0.0.0.0", allowed_hosts="a.example"))


def _wait_closed(sock: socket.socket) -> bytes:
    """Read until the server closes the connection; what it sent before closing."""
    sock.settimeout(SOCKET_BOUND_S)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def test_slow_requests_are_cut_off_and_others_still_served(cfg, spec, script_ids, caplog):
    cfg = cfg.replace(read_timeout=0.3)
    caplog.set_level(logging.DEBUG, logger="runtime.api.http.connection")
    with FakeScheduler(cfg, lambda r: script_ids), fronts(cfg, spec) as f:
        addr = ("127.0.0.1", f.port)
        silent = socket.create_connection(addr)
        slow_headers = socket.create_connection(addr)
        slow_headers.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow_body = socket.create_connection(addr)
        slow_body.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{"
        )
        for sock in (silent, slow_headers, slow_body):
            with sock:
                assert b"200 OK" not in _wait_closed(sock)
        # the read deadline closed all three, not another guard or the socket bound
        cut = [r for r in caplog.records if "no whole request in 0.3 s" in r.getMessage()]
        assert len(cut) == 3
        assert f.tm.num_inflight == 0
        r = httpx.post(f"{f.url}/v1/completions", json=completion(), timeout=30)
        assert r.status_code == 200


def test_connections_beyond_the_cap_are_closed(cfg, spec, script_ids):
    cfg = cfg.replace(max_connections=3)
    with FakeScheduler(cfg, lambda r: script_ids), fronts(cfg, spec) as f:
        addr = ("127.0.0.1", f.port)
        held = [socket.create_connection(addr) for _ in range(3)]
        with socket.create_connection(addr) as extra:
            assert _wait_closed(extra) == b""
        for sock in held:
            sock.close()

        def served() -> bool:
            try:
                return httpx.get(f"{f.url}/v1/models", timeout=30).status_code == 200
            except httpx.TransportError:  # the held ones may not be gone yet
                return False

        wait_until(served, SOCKET_BOUND_S, "a slot after the held connections closed")


def test_rid_is_bounded_and_logged_escaped(cfg, spec, script_ids, caplog):
    caplog.set_level(logging.INFO, logger="sluice.requests")
    with (
        FakeScheduler(cfg, lambda r: script_ids) as fake,
        fronts(cfg, spec) as f,
        httpx.Client(base_url=f.url, timeout=30) as http,
    ):
        r = http.post("/generate", json={"text": "Hi", "rid": "x" * (MAX_RID_LEN + 1)})
        assert r.status_code == 400 and str(MAX_RID_LEN) in r.json()["error"]["message"]
        forged = "r1\n2030-01-01 api INFO forged line"
        r = http.post(
            "/generate", json={"text": "Hi", "rid": forged, "sampling_params": {"max_tokens": 2}}
        )
        assert r.status_code == 200 and r.json()["id"] == forged
        assert forged not in [g.rid for g in fake.of_type(GenerateReq)]  # the api's own id
        wait_until(
            lambda: any("r1" in m for m in caplog.messages),
            SOCKET_BOUND_S,
            "the request's log line",
        )
    assert not any("\n" in m for m in caplog.messages)
    assert loggable(forged) == "r1\\n2030-01-01 api INFO forged line"
    assert loggable("y" * 10_000) == "y" * 64 + "..."


def test_no_cache_report_hides_cached_tokens(cfg, spec, script_ids):
    for report, want in ((True, 5), (False, 0)):
        c = cfg.replace(cache_report=report)
        with (
            FakeScheduler(c, lambda r: script_ids, cached_tokens=5),
            fronts(c, spec) as f,
            httpx.Client(base_url=f.url, timeout=30) as http,
        ):
            native = http.post("/generate", json={"text": "Hi"}).json()
            openai = http.post("/v1/completions", json=completion()).json()
            with Client(f.rpc_addr, timeout=30) as client:
                rpc = client.generate("Hi", max_tokens=3)
        assert native["usage"]["cached_tokens"] == want
        assert openai["usage"]["prompt_tokens_details"]["cached_tokens"] == want
        assert rpc.cached_tokens == want


def test_exposed_without_a_key_warns(caplog):
    caplog.set_level(logging.WARNING, logger="runtime.api.auth")
    warn_if_exposed("HTTP", "127.0.0.1", "")
    warn_if_exposed("HTTP", "0.0.0.0", KEY)
    assert not caplog.messages
    warn_if_exposed("RPC", "0.0.0.0", "")
    assert "RPC listens on 0.0.0.0 without an API key" in caplog.messages[0]


def test_flags_env_key_and_rpc_host(monkeypatch):
    monkeypatch.setenv("SLUICE_API_KEY", KEY)
    env = config_from_args(build_parser().parse_args(["serve", "--host", "0.0.0.0"]))
    flags = config_from_args(
        build_parser().parse_args(
            ["serve", "--api-key", "other", "--rpc-host", "0.0.0.0", "--no-cache-report"]
        )
    )
    for c in (env, flags):
        shutil.rmtree(c.ipc_dir, ignore_errors=True)
    assert env.api_key == KEY and KEY not in repr(env)
    assert env.rpc_addr.startswith("tcp://127.0.0.1:")  # HTTP exposed, RPC not
    assert flags.api_key == "other" and flags.rpc_addr.startswith("tcp://0.0.0.0:")
    assert flags.cache_report is False

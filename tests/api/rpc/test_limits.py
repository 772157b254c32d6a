"""The RPC port's limits: a client refuses a request over the server's message limit, a raw
peer that sends one anyway is dropped without leaking its requests, and connections
beyond `--max-rpc-connections` (or that never finish their handshake) are closed."""

from __future__ import annotations

import asyncio
import socket
import time

import msgspec
import pytest
import zmq

from runtime.client import AsyncClient, Client
from runtime.wire.errors import MessageTooLarge
from runtime.wire.request_output import RequestOutput
from runtime.wire.rpc import RpcGenerate, RpcOutput
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import AbortReq, GenerateReq
from tests.api.fake_scheduler import FakeScheduler
from tests.api.rpc.test_server import raw_dealer, serving

LIMIT = 4096  # --max-request-bytes of these tests


def wait_for(pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_client_refuses_a_request_over_the_servers_limit(cfg, spec, script_ids):
    cfg = cfg.replace(max_request_bytes=LIMIT)
    with FakeScheduler(cfg, lambda r: script_ids) as fake, \
            serving(cfg, spec) as (_, rpc, _lt), Client(rpc.addr, timeout=5) as client:
        with pytest.raises(MessageTooLarge, match=f"limit of {LIMIT} bytes") as err:
            client.generate("x" * LIMIT, max_tokens=2)
        assert err.value.limit == LIMIT and err.value.size > LIMIT
        with pytest.raises(MessageTooLarge):
            list(client.generate([7] * LIMIT, stream=True, max_tokens=2))
        assert client.generate("x" * (LIMIT // 2), max_tokens=2).finish_reason == "length"

        async def use_async():
            async with AsyncClient(rpc.addr, timeout=5) as ac:
                with pytest.raises(MessageTooLarge, match=f"limit of {LIMIT} bytes"):
                    await ac.generate("x" * LIMIT, max_tokens=2)
                return await asyncio.gather(*(ac.generate("hi", max_tokens=2) for _ in range(3)))

        outs = asyncio.run(use_async())
    assert [o.finish_reason for o in outs] == ["length"] * 3
    assert len(fake.of_type(GenerateReq)) == 4  # the refused ones never left the client


def test_a_raw_peer_over_the_limit_is_dropped_and_its_requests_aborted(cfg, spec, script_ids):
    cfg = cfg.replace(max_request_bytes=LIMIT)
    dec = msgspec.msgpack.Decoder(RpcOutput)
    params = SamplingParams(max_tokens=100)
    with FakeScheduler(cfg, lambda r: script_ids, stall=True) as fake, \
            serving(cfg, spec) as (tm, rpc, lt):
        with raw_dealer(rpc.addr) as sock:
            sock.send(msgspec.msgpack.encode(RpcGenerate("held", "hi", params)))
            assert fake.wait_for(lambda: fake.of_type(GenerateReq))
            sock.send(msgspec.msgpack.encode(RpcGenerate("over", "x" * LIMIT, params)))
            # its connection is gone: the request it left in flight is aborted at once,
            # although the stalled scheduler would never give it an output to fail on
            assert fake.wait_for(lambda: fake.of_type(AbortReq), timeout=5)
            assert wait_for(lambda: rpc.num_active == 0 and tm.num_inflight == 0)
        fake.stall = False
        with raw_dealer(rpc.addr) as sock:
            sock.send(msgspec.msgpack.encode(RpcGenerate("ok", "hi", SamplingParams(max_tokens=2),
                                                         stream=False)))
            out = dec.decode(sock.recv())
    assert isinstance(out, RequestOutput) and out.rid == "ok" and out.finish_reason == "length"
    assert [a.rid for a in fake.of_type(AbortReq)] == [fake.of_type(GenerateReq)[0].rid]


def test_connections_beyond_the_cap_are_closed_until_one_leaves(cfg, spec, script_ids):
    cfg = cfg.replace(max_rpc_connections=2)
    dec = msgspec.msgpack.Decoder(RpcOutput)
    hi = msgspec.msgpack.encode(RpcGenerate("third", "hi", SamplingParams(max_tokens=2),
                                            stream=False))
    with FakeScheduler(cfg, lambda r: script_ids), serving(cfg, spec) as (_, rpc, _lt):
        first, second = Client(rpc.addr, timeout=5), Client(rpc.addr, timeout=5)
        try:
            for c in (first, second):
                assert c.generate("hi", max_tokens=2).finish_reason == "length"
            with raw_dealer(rpc.addr) as third:
                third.setsockopt(zmq.RCVTIMEO, 500)
                third.send(hi)  # queued in the dealer: its connection keeps being refused
                with pytest.raises(zmq.Again):
                    third.recv()
                assert rpc.peers.refused >= 1 and rpc.peers.num_open <= 3
                second.close()  # a place frees: the third's next attempt gets in
                # a message queued on a refused connection may go down with it: resend
                # until one is answered (each attempt under its own rid)
                out = None
                for attempt in range(20):
                    try:
                        out = dec.decode(third.recv())
                        break
                    except zmq.Again:
                        third.send(msgspec.msgpack.encode(RpcGenerate(
                            f"third-{attempt}", "hi", SamplingParams(max_tokens=2),
                            stream=False)))
            assert isinstance(out, RequestOutput) and out.finish_reason == "length"
            assert first.generate("hi", max_tokens=2).finish_reason == "length"
        finally:
            first.close()
            if not second._sock.closed:
                second.close()


def test_connections_that_never_handshake_are_closed(cfg, spec, script_ids):
    cfg = cfg.replace(max_rpc_connections=2, read_timeout=0.5)
    with FakeScheduler(cfg, lambda r: script_ids), serving(cfg, spec) as (_, rpc, _lt):
        host, port = rpc.addr.removeprefix("tcp://").rsplit(":", 1)
        idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3)]
        try:
            for conn in idle:  # each is closed: the third at once, the others at the deadline
                assert _read_to_end(conn), "an idle connection was never closed"
            assert wait_for(lambda: rpc.peers.num_open == 0)
            with Client(rpc.addr, timeout=5) as client:
                assert client.generate("hi", max_tokens=2).finish_reason == "length"
        finally:
            for conn in idle:
                conn.close()


def _read_to_end(conn: socket.socket) -> bool:
    """Read what the server sends (its greeting) until it closes; False on a timeout."""
    try:
        while conn.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True

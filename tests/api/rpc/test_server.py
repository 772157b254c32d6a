"""RPC server + Client / AsyncClient, with the TokenizerManager on a LoopThread and a fake
scheduler behind it."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import msgspec
import pytest
import zmq

from runtime.api.loop_thread import LoopThread
from runtime.api.rpc.server import RpcServer
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.client import AsyncClient, Client
from runtime.wire.errors import InvalidRequest, Overloaded, ServerError, ServerTimeout
from runtime.wire.lifecycle import ProcessDied
from runtime.wire.request_output import FinishReason, RequestOutput
from runtime.wire.rpc import RpcError, RpcGenerate, RpcOutput
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import AbortReq, FinishReq, GenerateReq
from tests.api.fake_scheduler import FakeScheduler


@contextlib.contextmanager
def serving(cfg, spec):
    """A TokenizerManager and RpcServer running on a background loop (`rpc.addr`: the
    address it bound, `cfg.rpc_port` 0 picking a free port)."""
    lt = LoopThread()
    tm = TokenizerManager(cfg, spec)
    rpc = RpcServer(tm, cfg.rpc_addr)
    lt.run(tm.start())
    lt.run(tm.wait_limits(10))  # as the api process does before serving
    lt.run(rpc.start())
    try:
        yield tm, rpc, lt
    finally:
        lt.run(rpc.close())
        lt.run(tm.close())
        lt.close()


@contextlib.contextmanager
def raw_dealer(addr: str):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 3000)
    sock.connect(addr)
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()


def test_stream_and_non_stream_agree(cfg, spec, tok, script_ids):
    n = len(script_ids)
    with FakeScheduler(cfg, lambda r: script_ids), serving(cfg, spec) as (_, rpc, _lt), \
            Client(rpc.addr, timeout=5) as client:
        chunks = list(client.generate("Hi there", stream=True, max_tokens=n, logprobs=True))
        whole = client.generate("Hi there", max_tokens=n, temperature=0, seed=3)
    assert len(chunks) > 3
    assert "".join(c.text for c in chunks) == whole.text == tok.decode(script_ids)
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids == script_ids
    assert [p for c in chunks for p in c.logprobs] == [-0.5] * n
    assert chunks[-1].finish_reason == whole.finish_reason == "length"
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert whole.prompt_tokens == len(tok.encode("Hi there")) and whole.completion_tokens == n


def test_stop_string_over_rpc_finishes_it_in_the_scheduler(cfg, spec, tok, script_ids):
    full = tok.decode(script_ids)
    with FakeScheduler(cfg, lambda r: script_ids) as fake, \
            serving(cfg, spec) as (_, rpc, _lt), Client(rpc.addr, timeout=5) as client:
        out = client.generate("Hi", max_tokens=100, stop="END")
        assert fake.wait_for(lambda: fake.of_type(FinishReq))
    assert out.text == full[:full.index("END")] and out.finish_reason == FinishReason.STOP
    assert [f.rid for f in fake.of_type(FinishReq)] == [fake.of_type(GenerateReq)[0].rid]
    assert not fake.of_type(AbortReq)
    req = fake.of_type(GenerateReq)[0]
    assert req.params.stop == ["END"]


def test_invalid_requests_raise_and_server_keeps_serving(cfg, spec, script_ids):
    with FakeScheduler(cfg, lambda r: script_ids) as fake, \
            serving(cfg, spec) as (_, rpc, _lt), Client(rpc.addr, timeout=5) as client:
        # caught client-side
        for prompt, kw in [("hi", {"temperature": -1}), ("hi", {"bogus": 1}), ("", {}),
                           ([1, "a"], {}), ("hi", {"top_p": 2.0})]:
            with pytest.raises(InvalidRequest):
                client.generate(prompt, **kw)
        # caught by the server
        for prompt, kw, words in [([5] * spec.max_context, {}, "prompt tokens"),
                                  ([5, 10**6], {}, "vocabulary"),
                                  ("hi", {"max_tokens": spec.max_context}, "context length")]:
            with pytest.raises(InvalidRequest, match=words):
                client.generate(prompt, **kw)
            with pytest.raises(InvalidRequest, match=words):
                list(client.generate(prompt, stream=True, **kw))
        assert client.generate("fine", max_tokens=3).finish_reason == "length"
    assert len(fake.of_type(GenerateReq)) == 1


def test_malformed_messages_get_rpc_error(cfg, spec, script_ids):
    dec = msgspec.msgpack.Decoder(RpcOutput)
    with FakeScheduler(cfg, lambda r: script_ids), serving(cfg, spec) as (_, rpc, _lt), \
            raw_dealer(rpc.addr) as sock:
        sock.send(b"\xc1 definitely not msgpack")
        err = dec.decode(sock.recv())
        assert isinstance(err, RpcError) and err.rid == "" and "malformed" in err.message
        sock.send(msgspec.msgpack.encode(["RpcGenerate", "r7", "hi", {"temperature": "hot"}]))
        err = dec.decode(sock.recv())
        assert isinstance(err, RpcError) and err.rid == "r7" and err.kind == "invalid_request"
        sock.send_multipart([b"two", b"frames"])
        assert isinstance(dec.decode(sock.recv()), RpcError)
        # the server still serves, and stream=False is one whole output
        sock.send(msgspec.msgpack.encode(
            RpcGenerate("ok", "hi", SamplingParams(max_tokens=7), stream=False)))
        out = dec.decode(sock.recv())
        assert isinstance(out, RequestOutput) and out.rid == "ok" and len(out.token_ids) == 7
        assert out.finish_reason == "length" and out.text
        with pytest.raises(zmq.Again):
            sock.setsockopt(zmq.RCVTIMEO, 200)
            sock.recv()


def test_duplicate_rid_on_one_connection_is_rejected(cfg, spec, script_ids):
    dec = msgspec.msgpack.Decoder(RpcOutput)
    with FakeScheduler(cfg, lambda r: script_ids, stall=True), \
            serving(cfg, spec) as (_, rpc, _lt), raw_dealer(rpc.addr) as sock:
        req = RpcGenerate("dup", "hi", SamplingParams())
        sock.send(msgspec.msgpack.encode(req))
        sock.send(msgspec.msgpack.encode(req))
        err = dec.decode(sock.recv())
        assert isinstance(err, RpcError) and "already in flight" in err.message


def test_breaking_out_of_a_stream_aborts(cfg, spec, script_ids):
    with FakeScheduler(cfg, lambda r: script_ids * 50, step_s=0.01) as fake, \
            serving(cfg, spec) as (tm, rpc, lt), Client(rpc.addr, timeout=5) as client:
        for i, _ in enumerate(client.generate("Hi", stream=True, max_tokens=2000)):
            if i == 1:
                break
        assert fake.wait_for(lambda: fake.of_type(AbortReq))
        assert fake.wait_for(lambda: tm.num_inflight == 0 and rpc.num_active == 0)
        assert client.generate("again", max_tokens=2).finish_reason == "length"
    assert [a.reason for a in fake.of_type(AbortReq)] == ["abort"]


def test_process_died_fails_rpc_requests_fast(cfg, spec, script_ids):
    """The request in flight and the next one fail with the death (a ServerError naming
    it), not with the client's own timeout (a ServerTimeout, 600 s away here)."""
    with FakeScheduler(cfg, lambda r: script_ids, stall=True) as fs, \
            serving(cfg, spec) as (_, rpc, _lt), Client(rpc.addr, timeout=600) as client:
        stream = client.generate("Hi", stream=True)
        ctx = zmq.Context()
        sup = ctx.socket(zmq.PUSH)
        sup.connect(cfg.ipc("api_in"))

        def die_once_waiting() -> None:  # the death comes while the request waits
            assert fs.wait_for(lambda: fs.of_type(GenerateReq), timeout=30)
            sup.send(msgspec.msgpack.encode(ProcessDied("scheduler", 1)))
        killer = threading.Thread(target=die_once_waiting)
        killer.start()
        with pytest.raises(ServerError, match="scheduler process died"):
            list(stream)
        killer.join()
        with pytest.raises(ServerError, match="died"):
            client.generate("later")
        sup.close(linger=0)
        ctx.term()


def test_client_times_out_when_the_server_goes_away(cfg, spec, script_ids):
    with FakeScheduler(cfg, lambda r: script_ids * 50, step_s=0.01), \
            contextlib.ExitStack() as server:
        _, rpc, _lt = server.enter_context(serving(cfg, spec))
        with Client(rpc.addr, timeout=0.5) as client:
            stream = client.generate("Hi", stream=True, max_tokens=2000)
            assert next(stream).finish_reason is None
            server.close()  # the server goes away mid-stream
            with pytest.raises(ServerTimeout):  # the client's 0.5 s timeout, not a hang
                list(stream)
            with pytest.raises(ServerTimeout):
                client.generate("Hi")  # nobody listens any more


def test_async_client_concurrent_and_streaming(cfg, spec, tok):
    def script(req):
        ids = tok.encode(f" reply {req.input_ids[-1]} 世界 end")
        return ids * 100 if req.input_ids[-1] == 300 else ids

    async def main(addr: str):
        async with AsyncClient(addr, timeout=5) as client:
            wholes = await asyncio.gather(*(client.generate([5, 100 + i], max_tokens=30)
                                            for i in range(8)))
            chunks = [c async for c in await client.generate([5, 200], stream=True)]
            with pytest.raises(InvalidRequest):
                await client.generate("hi", min_p=7)
            with pytest.raises(InvalidRequest, match="vocabulary"):
                await client.generate([5, -3])
            stream = await client.generate([5, 300], stream=True, max_tokens=1000)
            async for _ in stream:
                break
            await stream.aclose()
            return wholes, chunks

    with FakeScheduler(cfg, script, per_msg=2) as fake, serving(cfg, spec) as (_, rpc, _lt):
        wholes, chunks = asyncio.run(main(rpc.addr))
        assert fake.wait_for(lambda: fake.of_type(AbortReq))
    assert [w.text for w in wholes] == [f" reply {100 + i} 世界 end" for i in range(8)]
    assert "".join(c.text for c in chunks) == " reply 200 世界 end" and len(chunks) > 2
    assert chunks[-1].finish_reason == "stop"


def test_overloaded_when_too_many_in_flight(cfg, spec, script_ids):
    cfg = cfg.replace(max_running=1, max_queue=1)
    with FakeScheduler(cfg, lambda r: script_ids, stall=True) as fake, \
            serving(cfg, spec) as (_, rpc, _lt), raw_dealer(rpc.addr) as sock, \
            Client(rpc.addr, timeout=5) as client:
        for rid in ("a", "b"):
            sock.send(msgspec.msgpack.encode(RpcGenerate(rid, "hi", SamplingParams())))
        assert fake.wait_for(lambda: len(fake.of_type(GenerateReq)) == 2)
        with pytest.raises(Overloaded, match="2 requests in flight"):
            client.generate("one too many")

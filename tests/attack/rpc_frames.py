"""Groups on the RPC port: about 140 malformed frames (each must get an `RpcError`, or an
output where the frame happens to be a fine request), nesting and int64 overflow among
them, and messages over the server's limit (the client refuses them; a raw peer sending
one is dropped while the server goes on serving)."""

from __future__ import annotations

import random

import msgspec
import zmq

from runtime.client import Client
from runtime.wire.errors import MessageTooLarge
from runtime.wire.request_output import RequestOutput
from runtime.wire.rpc import RpcError, RpcOutput
from tests.attack.harness import Tally, Target

REPLY_TIMEOUT_MS = 60_000
BAD = [None, -1, 1 << 63, (1 << 64) - 1, "x", "", [], {}, True, 1.5, b"\x00", "\n"]
PARAMS = ["max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "regex", "n",
          "stop_token_ids", "logprob_start_len", "priority"]


def frames() -> list[list[bytes]]:
    """The malformed messages, each a list of frames, in a fixed order."""
    enc = msgspec.msgpack.encode
    base = ["RpcGenerate", "r", "Hi", {"max_tokens": 2}, False, ""]
    out: list[list[bytes]] = []
    for pos in range(len(base)):
        for value in BAD:
            msg = list(base)
            msg[pos] = value
            out.append([enc(msg)])
    for name in PARAMS:
        for value in BAD[:6]:
            out.append([enc([*base[:3], {"max_tokens": 2, name: value}, False, ""])])
    rng = random.Random(13)
    out += [[rng.randbytes(rng.randint(0, 64))] for _ in range(12)]
    out += [[b""], [b"\x91" * 5000 + b"\xc0"], [enc(["RpcGenerate", "r", [[[[1]]]], {}])],
            [enc(["RpcGenerate", "r\nforged", "Hi", {"max_tokens": 2}])],
            [enc(["RpcGenerate", "x" * 1_000_000, "Hi", {"max_tokens": 2}])],
            [enc(["RpcGetModelInfo", 5])], [enc(["Nope", "r"])], [enc([])],
            [b"two", b"frames"], [enc(base), b"extra"]]
    return out


def rpc_malformed(target: Target, tally: Tally, scale: str) -> None:
    msgs = frames()
    if scale == "small":
        msgs = msgs[::5]
    dec = msgspec.msgpack.Decoder(RpcOutput)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, REPLY_TIMEOUT_MS)
    sock.connect(target.rpc_addr)
    try:
        for parts in msgs:
            what = f"rpc {parts[0][:40]!r}"
            sock.send_multipart(parts)
            try:
                reply = dec.decode(sock.recv())
                while isinstance(reply, RequestOutput) and not reply.finished:
                    reply = dec.decode(sock.recv())  # a frame that is a fine stream request
            except zmq.Again:
                tally.lose(what)
                continue
            if isinstance(reply, RpcError) and reply.kind != "server_error" \
                    or isinstance(reply, RequestOutput):
                tally.ok()
            else:
                tally.fail(f"{what}: {reply!r}"[:200])
    finally:
        sock.close()
        ctx.term()


def rpc_oversize(target: Target, tally: Tally, scale: str) -> None:
    with Client(target.rpc_addr, timeout=60) as client:
        try:
            client.generate("x" * (64 << 20), max_tokens=1)
            tally.fail("a 64 MiB prompt was sent")
        except MessageTooLarge:
            tally.ok()
        except Exception as e:
            tally.fail(f"a 64 MiB prompt: {e!r}")
        limit = client._max_message_bytes
    tally.checks["limit_bytes"] = limit
    ctx = zmq.Context()
    try:
        for i in range(3 if scale == "full" else 1):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 2000)
            sock.connect(target.rpc_addr)
            enc = msgspec.msgpack.encode
            sock.send(enc(["RpcGenerate", f"held{i}", "Hi", {"max_tokens": 32}, True, ""]))
            sock.send(enc(["RpcGenerate", "big", "x" * (limit + 1), {"max_tokens": 1}]))
            sock.close()
            tally.ok()  # dropped by design; the checks after the group tell the rest
    finally:
        ctx.term()
    with Client(target.rpc_addr, timeout=120) as client:
        out = client.generate("The capital of France is", max_tokens=2)
        tally.ok() if out.finished else tally.fail(f"served after: {out!r}")

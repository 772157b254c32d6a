"""Asyncio counterparts of `runtime.wire.ipc`'s typed PUSH/PULL queues (zmq.asyncio)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec
import zmq
import zmq.asyncio

T = TypeVar("T")


class AsyncPushQueue(Generic[T]):
    """Sending end of a pipeline channel, usable from coroutines and plain callbacks.

    `put` never blocks or awaits: the socket has no send high-water mark, so a slow peer
    costs memory rather than stalling the event loop, and `put` is safe inside `finally`
    blocks of cancelled tasks (where awaiting is unreliable).
    """

    def __init__(self, ctx: zmq.asyncio.Context, addr: str, *, bind: bool = False) -> None:
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.bind(addr) if bind else self.sock.connect(addr)
        self._enc = msgspec.msgpack.Encoder()

    def put(self, msg: T) -> None:
        # With NOBLOCK and no pending sends, pyzmq sends at once and returns a done future.
        self.sock.send(self._enc.encode(msg), zmq.NOBLOCK).result()

    def close(self, linger_ms: int = 0) -> None:
        """Close; `linger_ms` > 0 gives queued messages that long to reach the peer."""
        self.sock.close(linger=linger_ms)


class AsyncPullQueue(Generic[T]):
    """Receiving end of a pipeline channel, decoding to the channel's union type."""

    def __init__(self, ctx: zmq.asyncio.Context, addr: str, typ: Any, *,
                 bind: bool = True) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(addr) if bind else self.sock.connect(addr)
        self._dec = msgspec.msgpack.Decoder(typ)

    async def get(self) -> T:
        """The next message; raises `msgspec.DecodeError` / `ValidationError` on bad bytes."""
        frame = await self.sock.recv(copy=False)
        return self._dec.decode(frame.buffer)

    def close(self) -> None:
        self.sock.close(linger=0)

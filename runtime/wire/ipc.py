"""Typed ZeroMQ queues: a socket plus the msgspec codec of one channel's union type."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec
import zmq

T = TypeVar("T")


class PushQueue(Generic[T]):
    """Sending end of a PUSH/PULL pipeline channel."""

    def __init__(self, ctx: zmq.Context, addr: str, *, bind: bool = False) -> None:
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(addr) if bind else self.sock.connect(addr)
        self._enc = msgspec.msgpack.Encoder()

    def put(self, msg: T) -> None:
        self.sock.send(self._enc.encode(msg), copy=False)

    def close(self) -> None:
        self.sock.close(linger=0)


class FanOutQueue(Generic[T]):
    """Sends every message to each of several PUSH channels, encoded once (a PUSH socket
    connected to many peers would deal messages out round-robin instead)."""

    def __init__(self, ctx: zmq.Context, addrs: list[str], *, bind: bool = False) -> None:
        self.queues: list[PushQueue[T]] = [PushQueue(ctx, a, bind=bind) for a in addrs]
        self._enc = msgspec.msgpack.Encoder()

    def put(self, msg: T) -> None:
        frame = self._enc.encode(msg)
        for q in self.queues:
            q.sock.send(frame, copy=False)

    def close(self) -> None:
        for q in self.queues:
            q.close()


class PullQueue(Generic[T]):
    """Receiving end of a PUSH/PULL pipeline channel, decoding to the channel's type."""

    def __init__(self, ctx: zmq.Context, addr: str, typ: Any, *, bind: bool = True) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(addr) if bind else self.sock.connect(addr)
        self._dec = msgspec.msgpack.Decoder(typ)

    def get(self, timeout_ms: int | None = None) -> T | None:
        """Next message; None if nothing arrived within `timeout_ms` (None: wait forever)."""
        if timeout_ms is not None and not self.sock.poll(timeout_ms, zmq.POLLIN):
            return None
        return self._dec.decode(self.sock.recv(copy=False))

    def get_nowait(self) -> T | None:
        try:
            return self._dec.decode(self.sock.recv(zmq.NOBLOCK, copy=False))
        except zmq.Again:
            return None

    def drain(self) -> list[T]:
        """Everything waiting now, without blocking."""
        out = []
        while (msg := self.get_nowait()) is not None:
            out.append(msg)
        return out

    def close(self) -> None:
        self.sock.close(linger=0)

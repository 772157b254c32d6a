"""`RpcOutbox`: RPC replies sent once per event-loop turn, one message per client.

A request served over RPC has no task waking for each token: its `ReqState.on_ready`
marks it ready here, and the first mark of a loop turn schedules `flush`. `flush` takes
each ready request's output and sends every client one message, a `RequestOutput` or an
`RpcBatch` of several: after a `BatchOut`, one encode and one send per client.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio

from runtime.api.req_state import ReqState
from runtime.wire.errors import InvalidRequest, Overloaded, ServerError
from runtime.wire.request_output import RequestOutput
from runtime.wire.rpc import RpcBatch, RpcError, RpcOutput

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client's connection is gone; nobody will read what we send."""


@dataclass(eq=False)
class RpcStream:
    """One RPC request in flight: whose it is, and `done` once its last reply is sent
    (set to `ClientGone` if the client went away first). Its `state` hands out deltas
    or, for a request not streamed, the whole output once."""

    identity: bytes
    rid: str
    state: ReqState
    done: asyncio.Future
    marked: bool = False


def rpc_error(rid: str, e: BaseException) -> RpcError:
    """The reply for a request that failed with `e`."""
    if isinstance(e, InvalidRequest):
        return RpcError(rid, str(e), "invalid_request")
    if isinstance(e, Overloaded):
        return RpcError(rid, str(e), "overloaded")
    if isinstance(e, ServerError):
        return RpcError(rid, str(e), "server_error")
    return RpcError(rid, f"internal error: {e!r}", "server_error")


class RpcOutbox:
    """Sends replies on a ROUTER socket (no HWM, so a send never waits)."""

    def __init__(self, sock: zmq.asyncio.Socket) -> None:
        self._sock = sock
        self._enc = msgspec.msgpack.Encoder()
        self._ready: list[RpcStream] = []
        self._scheduled = False

    def send(self, identity: bytes, msg: RpcOutput) -> bool:
        """Send now; False if the client is gone (ROUTER_MANDATORY: unroutable)."""
        try:
            self._sock.send_multipart([identity, self._enc.encode(msg)], zmq.NOBLOCK).result()
        except zmq.ZMQError:
            return False
        return True

    def watch(self, s: RpcStream) -> None:
        """Send `s`'s output as it comes, until its last piece or error is sent."""
        s.state.on_ready = lambda _: self._mark(s)
        if s.state.event.is_set():
            self._mark(s)

    def _mark(self, s: RpcStream) -> None:
        if s.marked:
            return
        s.marked = True
        self._ready.append(s)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Take every ready request's output; send each client its replies as one message."""
        self._scheduled = False
        ready, self._ready = self._ready, []
        out: dict[bytes, list[tuple[RpcStream, RequestOutput]]] = {}
        for s in ready:
            s.marked = False
            if s.done.done():  # cancelled (aborted), or its client is gone
                continue
            try:
                piece = s.state.take()
            except Exception as e:  # the request failed: its error is its last reply
                self.send(s.identity, rpc_error(s.rid, e))
                s.done.set_result(None)
                continue
            if piece is not None:
                piece.rid = s.rid  # the client's (the TokenizerManager's is server-wide)
                out.setdefault(s.identity, []).append((s, piece))
        for identity, items in out.items():
            msgs = [m for _, m in items]
            sent = self.send(identity, msgs[0] if len(msgs) == 1 else RpcBatch(msgs))
            for s, msg in items:
                if not sent:
                    s.done.set_exception(ClientGone())
                elif msg.finished:
                    s.done.set_result(None)

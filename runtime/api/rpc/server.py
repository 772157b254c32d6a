"""`RpcServer`: the native streaming RPC front (ZMQ ROUTER, msgpack `RpcInput`/`RpcOutput`).

Each DEALER client sends `RpcGenerate` / `RpcAbort` / `RpcGetModelInfo`; replies carry
the client's rid, so one client can multiplex many requests. A request runs as one task
that opens it in the TokenizerManager and waits for its end, while `RpcOutbox` sends its
output: all of a client's outputs from one scheduler step go out as one message.
`RpcAbort` cancels the task, which aborts the request in the scheduler. ROUTER_MANDATORY
makes a send to a disconnected client fail, which we treat like an abort; when a
connection ends (`RpcPeers`), every client with requests in flight is sent an empty
`RpcBatch`, and the requests of those it cannot reach are aborted at once, not at their
next output. A message over `--max-request-bytes` (MAXMSGSIZE) is never read: zmq drops
that client's connection (`Client` asks for the limit, `RpcModelInfo.max_message_bytes`,
and refuses to send a larger one). Connections beyond `--max-rpc-connections` are closed.

With an API key, `RpcGenerate` and `RpcGetModelInfo` must carry it (else an "unauthorized"
`RpcError`); an `RpcAbort` needs none, as it reaches only its own connection's requests.
A connection that does not finish its ZMTP handshake within `read_timeout` is closed.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import zmq
import zmq.asyncio

from runtime.api.auth import key_matches, warn_if_exposed
from runtime.api.rid import check_rid, loggable
from runtime.api.rpc.outbox import ClientGone, RpcOutbox, RpcStream, rpc_error
from runtime.api.rpc.peers import RpcPeers
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.wire.errors import InvalidRequest, ServerError
from runtime.wire.rpc import (
    RpcAbort,
    RpcBatch,
    RpcError,
    RpcGenerate,
    RpcGetModelInfo,
    RpcInput,
    RpcModelInfo,
    RpcOutput,
)

log = logging.getLogger(__name__)
CLOSE_LINGER_MS = 1000  # replies still queued at close (the shutdown errors) get this long
HEARTBEAT_MS, HEARTBEAT_TIMEOUT_MS = 10_000, 30_000  # a peer silent this long is dropped
PROBE_DELAY_S = 0.05  # after a disconnection, zmq drops the peer's route within this


class RpcServer:
    """Serves `TokenizerManager.generate` to RPC clients on a ROUTER socket at `addr`,
    to those that send the key of the TokenizerManager's config (`api_key`), if any.
    Once started, `addr` is the address bound (with the port taken for port 0)."""

    def __init__(self, tm: TokenizerManager, addr: str) -> None:
        self.tm = tm
        self.addr = addr
        self._api_key = tm.cfg.api_key
        self._dec = msgspec.msgpack.Decoder(RpcInput)
        self._tasks: dict[tuple[bytes, str], asyncio.Task] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._serve_task: asyncio.Task | None = None
        self._outbox: RpcOutbox | None = None
        self.peers: RpcPeers | None = None
        self._probing = False

    async def start(self) -> None:
        """Bind the ROUTER socket and start serving (once the TokenizerManager has the
        scheduler's limits: they size MAXMSGSIZE)."""
        warn_if_exposed("RPC", self.tm.cfg.rpc_host, self._api_key)
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # never drop an output for a slow reader
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.HANDSHAKE_IVL, int(self.tm.cfg.read_timeout * 1000))
        self._sock.setsockopt(zmq.TCP_KEEPALIVE, 1)  # reap peers that vanished
        self._sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        self._sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        # a larger message is never read: zmq drops the sender's connection instead
        self._sock.setsockopt(zmq.MAXMSGSIZE, self.tm.max_request_bytes)
        self._sock.bind(self.addr)
        self.addr = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)  # port 0: the one taken
        self._outbox = RpcOutbox(self._sock)
        self.peers = RpcPeers(self._sock, self.tm.cfg.max_rpc_connections, self._probe_soon)
        self._serve_task = asyncio.create_task(self._serve(), name="rpc-serve")

    @property
    def num_active(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Stop accepting, cancel running requests (aborting them), close the socket."""
        if self._serve_task is None:
            return
        tasks = [self._serve_task, *self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._serve_task = None
        await self.peers.close()
        self._sock.close(linger=CLOSE_LINGER_MS)
        self._ctx.term()

    async def _serve(self) -> None:
        while True:
            frames = await self._sock.recv_multipart()
            try:
                self._handle(frames)
            except Exception:  # never let one message take the server down
                log.exception("rpc: failed to handle a message")

    def _handle(self, frames: list[bytes]) -> None:
        identity = frames[0]
        if len(frames) != 2:
            self._reply(identity, RpcError("", f"malformed message: expected 1 frame, "
                                               f"got {len(frames) - 1}"))
            return
        try:
            msg = self._dec.decode(frames[1])
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
            self._reply(identity, RpcError(_guess_rid(frames[1]), f"malformed message: {e}"))
            return
        key = (identity, msg.rid)
        if isinstance(msg, RpcAbort):
            if (task := self._tasks.get(key)) is not None:
                task.cancel()
            return
        if not key_matches(msg.api_key, self._api_key):
            self._reply(identity, RpcError(msg.rid, "missing or incorrect API key "
                                                    "(Client(api_key=...) or SLUICE_API_KEY)",
                                           "unauthorized"))
            return
        try:
            check_rid(msg.rid)
        except InvalidRequest as e:
            self._reply(identity, RpcError(msg.rid, str(e)))
            return
        if isinstance(msg, RpcGetModelInfo):
            self._reply(identity, RpcModelInfo(msg.rid, self.tm.model_info(),
                                               self.tm.max_request_bytes))
            return
        if key in self._tasks:
            self._reply(identity, RpcError(msg.rid, f"request id {msg.rid!r} is already "
                                                    "in flight on this connection"))
            return
        task = asyncio.create_task(self._run(identity, msg), name=f"rpc-{loggable(msg.rid)}")
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._forget(key, t))

    def _forget(self, key: tuple[bytes, str], task: asyncio.Task) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]

    async def _run(self, identity: bytes, req: RpcGenerate) -> None:
        """One request: open it, let the outbox send its output, release it at the end."""
        try:
            state = await self.tm.open(req.prompt, req.params, stream=req.stream)
        except Exception as e:
            if not isinstance(e, (InvalidRequest, ServerError)):
                log.exception("rpc: request %s failed", loggable(req.rid))
            self._reply(identity, rpc_error(req.rid, e))
            return
        s = RpcStream(identity, req.rid, state, asyncio.get_running_loop().create_future())
        try:
            self._outbox.watch(s)
            await s.done
        except ClientGone:
            log.info("rpc: client of request %s is gone; aborted", loggable(req.rid))
        finally:
            state.on_ready = None
            self.tm.release(state)

    def _probe_soon(self) -> None:
        if self._tasks and not self._probing:
            self._probing = True
            asyncio.get_running_loop().call_later(PROBE_DELAY_S, self._probe)

    def _probe(self) -> None:
        """Abort the requests of every client that can no longer be reached."""
        self._probing = False
        gone = {identity for identity, _ in self._tasks
                if not self._outbox.send(identity, RpcBatch([]))}
        aborted = [task for (identity, _), task in self._tasks.items() if identity in gone]
        for task in aborted:
            task.cancel()
        if aborted:
            log.info("rpc: %d clients gone; aborted their %d requests", len(gone), len(aborted))

    def _reply(self, identity: bytes, msg: RpcOutput) -> None:
        self._outbox.send(identity, msg)


def _guess_rid(payload: bytes) -> str:
    """The rid of a message that failed validation, if its frame is readable at all
    (array-like tagged structs encode as [tag, rid, ...])."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        return ""
    if isinstance(raw, list) and len(raw) > 1 and isinstance(raw[1], str):
        return raw[1]
    return ""

"""`Client` / `AsyncClient`: the native RPC clients (ZMQ DEALER, msgpack).

    client = Client("tcp://127.0.0.1:30001")
    out = client.generate("Hello", max_tokens=32, temperature=0)  # the whole RequestOutput
    for delta in client.generate("Hello", stream=True, max_tokens=32):  # RequestOutput deltas
        print(delta.text, end="")

Requests always stream over the wire, and non-streaming calls join the deltas here, so
`timeout` can bound the silence between two messages: a server that dies mid-request
raises `ServerTimeout` instead of hanging, while long generations still work.
One `Client` per thread; `AsyncClient` serves any number of tasks on one loop.
Both send `api_key` (default: the SLUICE_API_KEY environment variable) with every
request; a server with another key raises `Unauthorized`. Before its first request a
client asks the server for its model info, which says the largest message the server
reads: a larger request raises `MessageTooLarge` and is never sent (the server would drop
the connection without a reply).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from runtime.wire.errors import (
    InvalidRequest,
    MessageTooLarge,
    Overloaded,
    ServerError,
    ServerTimeout,
    Unauthorized,
)
from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import RequestOutput
from runtime.wire.rpc import (
    RpcAbort,
    RpcBatch,
    RpcError,
    RpcGenerate,
    RpcGetModelInfo,
    RpcModelInfo,
    RpcOutput,
)
from runtime.wire.sampling import SamplingParams

DEFAULT_ADDR = "tcp://127.0.0.1:30001"
API_KEY_ENV = "SLUICE_API_KEY"


class _RpcClient:
    """What both clients share: the codec, the server's message limit, the requests still
    running, and replies turned into outputs or typed errors."""

    def __init__(self, addr: str, timeout: float | None, api_key: str | None) -> None:
        self.addr = addr
        self.timeout = timeout
        self.api_key = api_key_or_env(api_key)
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(RpcOutput)
        self._max_message_bytes: int | None = None  # the server's, once asked
        self._running: set[str] = set()  # requests sent and not finished: aborted if left

    def _payload(self, req: RpcGenerate) -> bytes:
        """`req` encoded (`MessageTooLarge` over the server's limit); it counts as running
        from here until its last output or `_abort_frame`."""
        payload = self._enc.encode(req)
        check_size(payload, self._max_message_bytes)
        self._running.add(req.rid)
        return payload

    def _output(self, rid: str, msg: RpcOutput) -> RequestOutput:
        """The output `msg` carries for request `rid`, or the server's error raised; the
        request stops running at its last output or error."""
        if isinstance(msg, RpcError) or msg.finished:
            self._running.discard(rid)
        return _check(msg)

    def _abort_frame(self, rid: str) -> bytes | None:
        """The abort to send for request `rid` as its consumer leaves (None: it ended)."""
        if rid not in self._running:
            return None
        self._running.discard(rid)
        return self._enc.encode(RpcAbort(rid))

    def _model_info_reply(self, msg: RpcOutput) -> RpcModelInfo:
        reply = _info(msg)
        self._max_message_bytes = reply.max_message_bytes
        return reply

    def _silence(self) -> ServerTimeout:
        return ServerTimeout(f"no reply from {self.addr} in {self.timeout} s")


class Client(_RpcClient):
    """Blocking RPC client. `timeout`: seconds to wait for each message (None: forever);
    `api_key`: the server's key (None: SLUICE_API_KEY, if set)."""

    def __init__(self, addr: str = DEFAULT_ADDR, timeout: float | None = 60.0,
                 api_key: str | None = None) -> None:
        super().__init__(addr, timeout, api_key)
        self._ctx = zmq.Context()
        self._sock = _dealer(self._ctx, addr)
        self._sock.setsockopt(zmq.SNDTIMEO, -1 if timeout is None else int(timeout * 1000))
        self._inbox: dict[str, deque[RpcOutput]] = {}  # open requests' unread messages

    def generate(self, prompt: str | list[int], *, stream: bool = False,
                 **sampling: Any) -> RequestOutput | Iterator[RequestOutput]:
        """Generate from `prompt` with `SamplingParams(**sampling)`.

        stream=False: the whole `RequestOutput`. stream=True: an iterator of its deltas,
        `finish_reason` on the last; leaving it early aborts the request. Raises
        `InvalidRequest` or `ServerError` (`ServerTimeout`).
        """
        deltas = self._stream(_request(prompt, sampling, self.api_key))
        return deltas if stream else RequestOutput.join(list(deltas))

    def model_info(self) -> ModelInfo:
        """The served model's name, context length and chat role markers."""
        return self._model_info().info

    def _model_info(self) -> RpcModelInfo:
        rid = uuid.uuid4().hex
        self._inbox[rid] = deque()
        try:
            self._send(self._enc.encode(RpcGetModelInfo(rid, self.api_key)))
            return self._model_info_reply(self._recv(rid))
        finally:
            del self._inbox[rid]

    def _stream(self, req: RpcGenerate) -> Iterator[RequestOutput]:
        if self._max_message_bytes is None:
            self._model_info()
        payload = self._payload(req)
        self._inbox[req.rid] = deque()
        try:
            self._send(payload)
            while req.rid in self._running:
                yield self._output(req.rid, self._recv(req.rid))
        finally:
            del self._inbox[req.rid]
            abort = self._abort_frame(req.rid)
            if abort is not None and not self._sock.closed:
                with contextlib.suppress(zmq.Again):
                    self._sock.send(abort, zmq.NOBLOCK)

    def _send(self, frame: bytes) -> None:
        try:
            self._sock.send(frame)
        except zmq.Again:
            raise ServerTimeout(f"could not send to {self.addr} in {self.timeout} s") from None

    def _recv(self, rid: str) -> RpcOutput:
        """The next message of request `rid`, buffering other requests' messages."""
        inbox = self._inbox[rid]
        while not inbox:
            timeout_ms = None if self.timeout is None else int(self.timeout * 1000)
            if not self._sock.poll(timeout_ms, zmq.POLLIN):
                raise self._silence()
            for msg in _unbatch(_decode(self._dec, self._sock.recv())):
                if msg.rid in self._inbox:
                    self._inbox[msg.rid].append(msg)
                elif isinstance(msg, RpcError) and msg.rid == "":
                    raise ServerError(f"the server rejected a message: {msg.message}")
        return inbox.popleft()

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_RpcClient):
    """asyncio RPC client; `await generate(...)`, or `async for` over a stream."""

    def __init__(self, addr: str = DEFAULT_ADDR, timeout: float | None = 60.0,
                 api_key: str | None = None) -> None:
        super().__init__(addr, timeout, api_key)
        self._ctx = zmq.asyncio.Context()
        self._sock = _dealer(self._ctx, addr)
        self._inbox: dict[str, asyncio.Queue[RpcOutput | ServerError]] = {}
        self._reader: asyncio.Task | None = None
        self._asking = asyncio.Lock()  # one model-info request for concurrent first requests

    async def generate(self, prompt: str | list[int], *, stream: bool = False,
                       **sampling: Any) -> RequestOutput | AsyncIterator[RequestOutput]:
        """Like `Client.generate`; with stream=True, `async for d in await generate(...)`."""
        deltas = self._stream(_request(prompt, sampling, self.api_key))
        return deltas if stream else RequestOutput.join([d async for d in deltas])

    async def model_info(self) -> ModelInfo:
        """The served model's name, context length and chat role markers."""
        return (await self._model_info()).info

    async def _model_info(self) -> RpcModelInfo:
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())
        rid = uuid.uuid4().hex
        self._inbox[rid] = asyncio.Queue()
        try:
            self._send_nowait(self._enc.encode(RpcGetModelInfo(rid, self.api_key)))
            return self._model_info_reply(await self._next(rid))
        finally:
            del self._inbox[rid]

    async def _stream(self, req: RpcGenerate) -> AsyncIterator[RequestOutput]:
        async with self._asking:
            if self._max_message_bytes is None:
                await self._model_info()
        payload = self._payload(req)
        self._inbox[req.rid] = asyncio.Queue()
        try:
            try:
                self._send_nowait(payload)
            except zmq.Again:
                raise ServerTimeout(f"the send queue to {self.addr} is full") from None
            while req.rid in self._running:
                yield self._output(req.rid, await self._next(req.rid))
        finally:
            del self._inbox[req.rid]
            abort = self._abort_frame(req.rid)
            if abort is not None and not self._sock.closed:
                with contextlib.suppress(zmq.Again):
                    self._send_nowait(abort)

    async def _next(self, rid: str) -> RpcOutput:
        """The next message of request `rid`; raises what the reader hit meanwhile."""
        try:
            msg = await asyncio.wait_for(self._inbox[rid].get(), self.timeout)
        except asyncio.TimeoutError:
            raise self._silence() from None
        if isinstance(msg, ServerError):
            raise msg
        return msg

    def _send_nowait(self, frame: bytes) -> None:
        """Send at once (pyzmq returns a finished future); zmq.Again if the queue is full."""
        self._sock.send(frame, zmq.NOBLOCK).result()

    async def _read(self) -> None:
        """Route every reply to its request's queue."""
        while True:
            try:
                msg = _decode(self._dec, await self._sock.recv())
            except ServerError as e:
                msg = e
            if isinstance(msg, RpcError) and msg.rid == "":
                msg = ServerError(f"the server rejected a message: {msg.message}")
            if isinstance(msg, ServerError):
                for inbox in self._inbox.values():
                    inbox.put_nowait(msg)
                continue
            for m in _unbatch(msg):
                if m.rid in self._inbox:
                    self._inbox[m.rid].put_nowait(m)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._sock.close(linger=0)
        self._ctx.term()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# ------------------------------------------------------------ shared helpers
def api_key_or_env(api_key: str | None) -> str:
    """`api_key`, or the SLUICE_API_KEY environment variable when it is None."""
    return api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")


def _dealer(ctx: zmq.Context, addr: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    return sock


def _request(prompt: str | list[int], sampling: dict[str, Any], api_key: str) -> RpcGenerate:
    """Build and validate a request client-side (the server checks again)."""
    try:
        params = SamplingParams(**sampling)
    except TypeError as e:
        raise InvalidRequest(f"bad sampling parameter: {e}") from None
    params.validate()
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("prompt is empty")
    elif not isinstance(prompt, list) or not prompt:
        raise InvalidRequest("prompt must be a non-empty string or list of token ids")
    elif not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise InvalidRequest("prompt token ids must be ints")
    return RpcGenerate(uuid.uuid4().hex, prompt, params, stream=True, api_key=api_key)


def check_size(payload: bytes, limit: int) -> None:
    """`MessageTooLarge` if an encoded request is over the server's `limit` (0: unknown)."""
    if limit and len(payload) > limit:
        raise MessageTooLarge(len(payload), limit)


def _decode(dec: msgspec.msgpack.Decoder, frame: bytes) -> RpcOutput:
    try:
        return dec.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ServerError(f"undecodable reply from the server: {e}") from None


def _unbatch(msg: RpcOutput) -> list[RpcOutput]:
    """The messages a reply carries (an `RpcBatch` holds several requests' outputs)."""
    return msg.outputs if isinstance(msg, RpcBatch) else [msg]


def _info(msg: RpcOutput) -> RpcModelInfo:
    if not isinstance(msg, RpcModelInfo):
        _check(msg)  # raises the server's error
        raise ServerError(f"unexpected reply to a model info request: {msg!r}")
    return msg


def _check(msg: RpcOutput) -> RequestOutput:
    """The output, or the server's error raised as a typed exception."""
    if isinstance(msg, RpcError):
        if msg.kind == "invalid_request":
            raise InvalidRequest(msg.message)
        if msg.kind == "overloaded":
            raise Overloaded(msg.message)
        if msg.kind == "unauthorized":
            raise Unauthorized(msg.message)
        raise ServerError(f"{msg.kind}: {msg.message}")
    return msg

"""`AsyncClient`: the asyncio RPC client, serving any number of tasks on one loop (see
`runtime.client`)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from runtime.client.core import DEFAULT_ADDR, RpcClientCore, decode_reply, rejected, unbatch
from runtime.wire.errors import ServerError, ServerTimeout
from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import RequestOutput
from runtime.wire.rpc import RpcGenerate, RpcModelInfo, RpcOutput


class AsyncClient(RpcClientCore):
    """asyncio RPC client; `await generate(...)`, or `async for` over a stream."""

    def __init__(self, addr: str = DEFAULT_ADDR, timeout: float | None = 60.0,
                 api_key: str | None = None) -> None:
        super().__init__(addr, timeout, api_key)
        self._ctx = zmq.asyncio.Context()
        self._sock = self._dealer(self._ctx)
        self._inbox: dict[str, asyncio.Queue[RpcOutput | ServerError]] = {}
        self._reader: asyncio.Task | None = None
        self._asking = asyncio.Lock()  # one model-info request for concurrent first requests

    async def generate(self, prompt: str | list[int], *, stream: bool = False,
                       **sampling: Any) -> RequestOutput | AsyncIterator[RequestOutput]:
        """Like `Client.generate`; with stream=True, `async for d in await generate(...)`."""
        deltas = self._stream(self._request(prompt, sampling))
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
            self._send_nowait(self._model_info_frame(rid))
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
                msg = decode_reply(self._dec, await self._sock.recv())
            except ServerError as e:
                msg = e
            if (error := rejected(msg)) is not None:
                msg = error
            if isinstance(msg, ServerError):
                for inbox in self._inbox.values():
                    inbox.put_nowait(msg)
                continue
            for m in unbatch(msg):
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

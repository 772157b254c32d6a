"""`Client`: the blocking RPC client, one per thread (see `runtime.client`)."""

from __future__ import annotations

import contextlib
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any

import zmq

from runtime.client.core import DEFAULT_ADDR, RpcClientCore, decode_reply, rejected, unbatch
from runtime.wire.errors import ServerTimeout
from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import RequestOutput
from runtime.wire.rpc import RpcGenerate, RpcModelInfo, RpcOutput


class Client(RpcClientCore):
    """Blocking RPC client. `timeout`: seconds to wait for each message (None: forever);
    `api_key`: the server's key (None: SLUICE_API_KEY, if set)."""

    def __init__(self, addr: str = DEFAULT_ADDR, timeout: float | None = 60.0,
                 api_key: str | None = None) -> None:
        super().__init__(addr, timeout, api_key)
        self._ctx = zmq.Context()
        self._sock = self._dealer(self._ctx)
        self._sock.setsockopt(zmq.SNDTIMEO, -1 if timeout is None else int(timeout * 1000))
        self._inbox: dict[str, deque[RpcOutput]] = {}  # open requests' unread messages

    def generate(self, prompt: str | list[int], *, stream: bool = False,
                 **sampling: Any) -> RequestOutput | Iterator[RequestOutput]:
        """Generate from `prompt` with `SamplingParams(**sampling)`.

        stream=False: the whole `RequestOutput`. stream=True: an iterator of its deltas,
        `finish_reason` on the last; leaving it early aborts the request. Raises
        `InvalidRequest` or `ServerError` (`ServerTimeout`).
        """
        deltas = self._stream(self._request(prompt, sampling))
        return deltas if stream else RequestOutput.join(list(deltas))

    def model_info(self) -> ModelInfo:
        """The served model's name, context length and chat role markers."""
        return self._model_info().info

    def _model_info(self) -> RpcModelInfo:
        rid = uuid.uuid4().hex
        self._inbox[rid] = deque()
        try:
            self._send(self._model_info_frame(rid))
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
            for msg in unbatch(decode_reply(self._dec, self._sock.recv())):
                if msg.rid in self._inbox:
                    self._inbox[msg.rid].append(msg)
                elif (error := rejected(msg)) is not None:
                    raise error
        return inbox.popleft()

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""`RpcClientCore`: what `Client` and `AsyncClient` share: the codec, the server's message
limit, the requests still running, the DEALER socket's set-up, requests built and checked
client-side, and replies turned into outputs or typed errors."""

from __future__ import annotations

import os
import uuid
from typing import Any

import msgspec
import zmq

from runtime.wire.errors import (
    InvalidRequest,
    MessageTooLarge,
    Overloaded,
    ServerError,
    ServerTimeout,
    Unauthorized,
)
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


class RpcClientCore:
    """The state and message handling of one client; subclasses own the socket."""

    def __init__(self, addr: str, timeout: float | None, api_key: str | None) -> None:
        self.addr = addr
        self.timeout = timeout
        self.api_key = api_key_or_env(api_key)
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(RpcOutput)
        self._max_message_bytes: int | None = None  # the server's, once asked
        self._running: set[str] = set()  # requests sent and not finished: aborted if left

    def _dealer(self, ctx: zmq.Context) -> zmq.Socket:
        """A DEALER socket of `ctx` connected to the server, dropping unsent messages on
        close."""
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.addr)
        return sock

    def _request(self, prompt: str | list[int], sampling: dict[str, Any]) -> RpcGenerate:
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
        return RpcGenerate(uuid.uuid4().hex, prompt, params, stream=True,
                           api_key=self.api_key)

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

    def _model_info_frame(self, rid: str) -> bytes:
        """The model info request `rid`, encoded."""
        return self._enc.encode(RpcGetModelInfo(rid, self.api_key))

    def _model_info_reply(self, msg: RpcOutput) -> RpcModelInfo:
        reply = _info(msg)
        self._max_message_bytes = reply.max_message_bytes
        return reply

    def _silence(self) -> ServerTimeout:
        return ServerTimeout(f"no reply from {self.addr} in {self.timeout} s")


def api_key_or_env(api_key: str | None) -> str:
    """`api_key`, or the SLUICE_API_KEY environment variable when it is None."""
    return api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")


def check_size(payload: bytes, limit: int) -> None:
    """`MessageTooLarge` if an encoded request is over the server's `limit` (0: unknown)."""
    if limit and len(payload) > limit:
        raise MessageTooLarge(len(payload), limit)


def decode_reply(dec: msgspec.msgpack.Decoder, frame: bytes) -> RpcOutput:
    """One reply frame decoded; `ServerError` if it is not one."""
    try:
        return dec.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ServerError(f"undecodable reply from the server: {e}") from None


def unbatch(msg: RpcOutput) -> list[RpcOutput]:
    """The messages a reply carries (an `RpcBatch` holds several requests' outputs)."""
    return msg.outputs if isinstance(msg, RpcBatch) else [msg]


def rejected(msg: RpcOutput) -> ServerError | None:
    """The error of a reply to no request (the server rejected a message), else None."""
    if isinstance(msg, RpcError) and msg.rid == "":
        return ServerError(f"the server rejected a message: {msg.message}")
    return None


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

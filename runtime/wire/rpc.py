"""RPC client <-> api: `RpcInput` one way, `RpcOutput` the other."""

from __future__ import annotations

from runtime.wire.model_info import ModelInfo
from runtime.wire.record import WireRecord
from runtime.wire.request_output import RequestOutput
from runtime.wire.sampling import SamplingParams


class RpcGenerate(WireRecord):
    rid: str
    prompt: str | list[int]
    params: SamplingParams
    stream: bool = True
    api_key: str = ""  # the server's `--api-key`, when it has one


class RpcAbort(WireRecord):
    rid: str


class RpcGetModelInfo(WireRecord):
    """Ask for the served model's `ModelInfo` (answered with `RpcModelInfo`)."""

    rid: str
    api_key: str = ""  # the server's `--api-key`, when it has one


class RpcBatch(WireRecord):
    """Several requests' outputs to one client, sent together (those of one scheduler step)."""

    outputs: list[RequestOutput]


class RpcModelInfo(WireRecord):
    rid: str
    info: ModelInfo
    max_message_bytes: int = 0  # the largest message the server reads (0: not said)


class RpcError(WireRecord):
    rid: str
    message: str
    # "invalid_request" | "overloaded" | "server_error" | "unauthorized"
    kind: str = "invalid_request"


RpcInput = RpcGenerate | RpcAbort | RpcGetModelInfo
RpcOutput = RequestOutput | RpcBatch | RpcError | RpcModelInfo

"""OpenAI-compatible request schemas (msgspec) and the error JSON (the responses:
`runtime.api.openai.responses`).

Requests decode straight from the body: a field of the wrong type fails with a message
naming it (`Expected `float | null`, got `str` - at `$.temperature``); unknown fields are
ignored, as clients send extras. `to_params` turns the sampling fields into
`SamplingParams`, rejecting what Sluice does not do rather than silently ignoring it.
Sluice extensions (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `priority`,
`stop_token_ids`, `skip_special_tokens`, `allowed_token_ids`) go in the body; the `openai`
client sends them with `extra_body={...}`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.api.openai.response_format import response_json_schema
from runtime.api.tools.protocol import ToolCallItem
from runtime.wire.errors import EngineDeadError, InvalidRequest, Overloaded, ServerError
from runtime.wire.sampling import MAX_TOP_LOGPROBS, SamplingParams

MAX_N = 16  # choices per request (each runs as its own request)


class ApiError(Exception):
    """An error answered as OpenAI error JSON with an HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = (
            status, message, type_, code, param)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def api_error(exc: Exception) -> ApiError:
    """The HTTP status and OpenAI error of an exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InvalidRequest):  # a subclass may name an OpenAI error code
        return ApiError(400, str(exc), code=getattr(exc, "code", None))
    if isinstance(exc, Overloaded):
        return ApiError(429, str(exc), "rate_limit_error", "server_overloaded")
    if isinstance(exc, EngineDeadError):
        return ApiError(503, str(exc), "server_error", "engine_dead")
    if isinstance(exc, ServerError):
        return ApiError(500, str(exc), "server_error")
    return ApiError(500, f"internal error: {exc!r}", "server_error")


# ---------------------------------------------------------------- requests
class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _SamplingRequest(msgspec.Struct, kw_only=True):
    """Fields shared by completions and chat completions."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    user: str | None = None  # accepted for compatibility; not used
    logit_bias: dict[int, float] | None = None  # token id (a string key in JSON) -> bias
    # {"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": ...}}
    response_format: dict[str, Any] | None = None
    # Sluice extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    priority: int = 0
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingRequest, kw_only=True):
    """`POST /v1/completions`."""

    prompt: str | list[Any]  # a string, token ids, or a list of either
    # the chosen tokens' logprobs and this many alternatives each (0..MAX_TOP_LOGPROBS:
    # OpenAI's own API allows 5)
    logprobs: int | None = None
    echo: bool = False  # the prompt before the completion (and its logprobs, if asked)
    suffix: str | None = None  # rejected
    best_of: int | None = None  # rejected beyond 1


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool's answer: the call it answers


class ChatCompletionRequest(_SamplingRequest, kw_only=True):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # preferred over max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None  # alternatives per token (0..20), with logprobs=true
    # checked by `runtime.api.tools.request`
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false}


def decode_request(body: bytes, typ: type[msgspec.Struct]) -> Any:
    """Decode a JSON body into `typ`; raise `ApiError(400)` naming what is wrong."""
    try:
        return msgspec.json.decode(body, type=typ)
    except msgspec.ValidationError as e:
        raise ApiError(400, f"invalid request: {e}") from None
    except msgspec.DecodeError as e:
        raise ApiError(400, f"malformed JSON body: {e}") from None
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply") from None


def prompt_list(prompt: str | list[Any]) -> list[str | list[int]]:
    """The prompts of a completions request: a string, token ids, or a list of either."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(_is_token(t) for t in prompt):
        return [prompt]
    if prompt and all(isinstance(p, str) or (isinstance(p, list) and all(_is_token(t) for t in p))
                      for p in prompt):
        return list(prompt)
    raise ApiError(400, "prompt must be a non-empty string, a list of token ids, or a list of "
                        "strings or token id lists", param="prompt")


def _is_token(t: object) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def to_params(req: _SamplingRequest, max_tokens: int) -> SamplingParams:
    """The sampling parameters of one choice (validated by the TokenizerManager)."""
    if not 1 <= req.n <= MAX_N:
        raise ApiError(400, f"n must be between 1 and {MAX_N}, got {req.n}", param="n")
    least = 0 if getattr(req, "echo", False) else 1  # echo alone may score the prompt only
    if max_tokens < least:
        raise ApiError(400, f"max_tokens must be at least {least}, got {max_tokens}",
                       param="max_tokens")
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed with stream=true",
                       param="stream_options")
    given = {name: getattr(req, name) for name in (
        "temperature", "top_p", "seed", "frequency_penalty", "presence_penalty", "top_k",
        "min_p", "repetition_penalty", "stop_token_ids", "logit_bias", "allowed_token_ids")}
    fields = {k: v for k, v in given.items() if v is not None}
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    try:
        schema = response_json_schema(req.response_format)
    except InvalidRequest as e:
        raise ApiError(400, str(e), param="response_format") from None
    params = SamplingParams(max_tokens=max_tokens, stop=stop, ignore_eos=req.ignore_eos,
                            priority=req.priority, skip_special_tokens=req.skip_special_tokens,
                            json_schema=schema, **fields)
    try:
        params.validate()
    except InvalidRequest as e:
        raise ApiError(400, str(e)) from None
    return params


def given_fields(req: _SamplingRequest) -> frozenset[str]:
    """The SamplingParams fields the request set (the model's defaults fill the others)."""
    given = {name for name in SamplingParams.__struct_fields__
             if getattr(req, name, None) is not None}
    if getattr(req, "max_completion_tokens", None) is not None:
        given.add("max_tokens")
    return frozenset(given)


def check_completion(req: CompletionRequest) -> None:
    """Reject completions fields Sluice does not implement."""
    if req.suffix:
        raise ApiError(400, "suffix is not supported", param="suffix")
    if req.best_of not in (None, 1):
        raise ApiError(400, "best_of is not supported; use n", param="best_of")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got "
                            f"{req.logprobs}", param="logprobs")


def check_chat(req: ChatCompletionRequest) -> None:
    """Reject chat fields Sluice does not implement."""
    if req.top_logprobs is not None:
        if not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ApiError(400, f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got "
                                f"{req.top_logprobs}", param="top_logprobs")
        if req.top_logprobs and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    if not req.messages:
        raise ApiError(400, "messages must not be empty", param="messages")

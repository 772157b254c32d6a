"""`POST /generate`: Sluice's native endpoint and SGLang's (text or token ids in, JSON or
SSE out).

A body in SGLang's form, one that uses any name or shape only SGLang's protocol has
(`max_new_tokens`, `n`, `return_text_in_logprobs`, `model`, a batch, ...: see
`runtime.api.sglang.request`), is served as SGLang serves it
(`runtime.api.sglang.serving`): `text`, `output_ids` and `meta_info`, cumulative when
streamed. Any other body is Sluice's own form, below.

Request: `{"text": str} | {"input_ids": [int]}`, `"sampling_params": {...}` (the fields of
`SamplingParams`, unknown names rejected: `regex` constrains the output, `logit_bias` maps
token ids, as JSON strings, to biases), `"stream"`, and the extras `"priority"`,
`"ignore_eos"`, `"return_logprob"`, `"logprob_start_len"` (these override
sampling_params), `"rid"`.
Response: `{"id", "text", "output_ids", "finish_reason", "usage": {"prompt_tokens",
"completion_tokens", "cached_tokens"}}` plus `"logprobs"` when asked, and with
`logprob_start_len >= 0` `"input_logprobs"` / `"input_token_ids"`: the logprob of each
prompt token from that position on (the first token has none) and the tokens scored.
With `sampling_params.top_logprobs` = k, `"top_logprobs"` (and with input logprobs
`"input_top_logprobs"`) lists, per scored token, its k most likely tokens as
`[token_id, logprob]` pairs, most likely first.
`max_tokens: 0` only prefills the prompt (caching it, computing input logprobs). Streamed,
each event carries the same keys with `text` / `output_ids` / `logprobs` /
`input_logprobs` as deltas, `finish_reason` null until the last, then `data: [DONE]`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from runtime.api.http.sampling_json import params_from_json
from runtime.api.openai.protocol import ApiError, api_error
from runtime.api.rid import loggable
from runtime.api.sglang.request import is_sglang_form, parse_sglang
from runtime.api.sglang.serving import SglangServing
from runtime.api.sse import DONE, sse
from runtime.api.streams import EventStream, Guard, MergedStreams, collect, start_streams
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.wire.request_output import RequestOutput
from runtime.wire.sampling import SamplingParams

log = logging.getLogger(__name__)
_PARAM_NAMES = frozenset(SamplingParams.__struct_fields__)


class GenerateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Sluice's own `/generate` body (its fields are `sglang_request.SLUICE_FIELDS`)."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] = {}
    stream: bool = False
    priority: int | None = None
    ignore_eos: bool | None = None
    return_logprob: bool = False
    rid: str | None = None
    logprob_start_len: int | None = None


def to_params(req: GenerateRequest) -> SamplingParams:
    """The request's SamplingParams; raise `ApiError(400)` naming a bad field."""
    unknown = sorted(set(req.sampling_params) - _PARAM_NAMES)
    if unknown:
        raise ApiError(400, f"unknown sampling_params {unknown}; known: {sorted(_PARAM_NAMES)}",
                       param="sampling_params")
    params = params_from_json(req.sampling_params)
    if req.priority is not None:
        params.priority = req.priority
    if req.ignore_eos is not None:
        params.ignore_eos = req.ignore_eos
    params.logprobs = params.logprobs or req.return_logprob
    if req.logprob_start_len is not None:
        params.logprob_start_len = req.logprob_start_len
    return params


class NativeServing:
    """Serves `/generate` over the TokenizerManager, in either form."""

    def __init__(self, tm: TokenizerManager, sglang: SglangServing) -> None:
        self.tm = tm
        self.sglang = sglang

    async def generate(self, body: dict[str, Any], guard: Guard) -> Any:
        """The reply to a `/generate` body (a JSON object), in the body's form."""
        if is_sglang_form(body):
            return await self.sglang.generate(parse_sglang(body, self.tm.lora_names), guard)
        try:
            req = msgspec.convert(body, GenerateRequest)
        except msgspec.ValidationError as e:
            raise ApiError(400, f"invalid request: {e}") from None
        return await self._generate(req, guard)

    async def _generate(self, req: GenerateRequest,
                        guard: Guard) -> dict[str, Any] | EventStream:
        if (req.text is None) == (req.input_ids is None):
            raise ApiError(400, "give exactly one of `text` and `input_ids`")
        prompt = req.text if req.text is not None else req.input_ids
        params = to_params(req)
        rid = req.rid or uuid.uuid4().hex
        given = frozenset(name for name, value in req.sampling_params.items() if value is not None)
        gen = self.tm.generate(prompt, params, rid, stream=req.stream, given=given)
        streams, first = await start_streams([gen], guard)
        if req.stream:
            return EventStream(self._events(params, streams, first[1]), streams)
        try:
            outs = [first[1]] + [o for _, o in await guard(collect(streams))]
        finally:
            await streams.aclose()
        return _body(RequestOutput.join(outs), params)

    async def _events(self, params: SamplingParams, streams: MergedStreams,
                      first: RequestOutput) -> AsyncIterator[bytes]:
        rid = first.rid
        try:
            yield sse(_body(first, params))
            async for _, out in streams:
                yield sse(_body(out, params))
        except Exception as e:  # the response has started: the error is the last event
            log.warning("stream %s ended with an error: %r", loggable(rid), e)
            yield sse(api_error(e).body())
        finally:
            await streams.aclose()
        yield DONE


def _body(out: RequestOutput, params: SamplingParams) -> dict[str, Any]:
    """The JSON of a whole response or of one streamed event (`out` is a delta)."""
    body: dict[str, Any] = {
        "id": out.rid, "text": out.text, "output_ids": out.token_ids,
        "finish_reason": out.finish_reason,
        "usage": {"prompt_tokens": out.prompt_tokens,
                  "completion_tokens": out.completion_tokens,
                  "cached_tokens": out.cached_tokens}}
    if params.logprobs:
        body["logprobs"] = out.logprobs
    if params.logprob_start_len >= 0:
        body["input_logprobs"] = out.input_logprobs
        body["input_token_ids"] = out.input_token_ids
    if params.top_logprobs:
        body["top_logprobs"] = [out.top(i) for i in range(len(out.token_ids))]
        if params.logprob_start_len >= 0:
            body["input_top_logprobs"] = [out.top(i, prompt=True)
                                          for i in range(len(out.input_logprobs))]
    return body

"""`OpenAIServing`: `/v1/completions` and `/v1/chat/completions` over the TokenizerManager.

Each choice (n per prompt) runs as its own request (`rid = <response id>-<choice>`, seed
+ choice when a seed is given); their streams are merged. The first chunk is awaited
before anything is returned, so a request rejected by validation, by the queue limit or
by the scheduler still gets a proper HTTP status; after that, a stream ends with an
error event and `[DONE]`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.api.chat import chat_prompt_text
from runtime.api.chunk import Chunk
from runtime.api.openai_protocol import (
    ApiError,
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatStreamChoice,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    TokenLogprob,
    Usage,
    api_error,
    check_chat,
    check_completion,
    prompt_list,
    to_params,
)
from runtime.api.streams import EventStream, Guard, MergedStreams, collect, start_streams
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.messages import SamplingParams

log = logging.getLogger(__name__)
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DONE = b"data: [DONE]\n\n"
_JSON = msgspec.json.Encoder()  # one encoder for every event of every stream


def sse(payload: Any) -> bytes:
    """One server-sent event carrying `payload` as JSON."""
    return b"data: %b\n\n" % _JSON.encode(payload)


@dataclass
class _Choice:
    """Everything one choice produced so far."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def add(self, chunk: Chunk) -> None:
        self.text.append(chunk.text)
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.finish_reason = chunk.finish_reason
        self.prompt_tokens, self.cached_tokens = chunk.prompt_tokens, chunk.cached_tokens
        self.completion_tokens = chunk.completion_tokens


@dataclass
class _Call:
    """One OpenAI call in progress: `len(prompts) * n` choices."""

    id: str
    chat: bool
    model: str
    n: int
    logprobs: bool
    include_usage: bool
    created: int = field(default_factory=lambda: int(time.time()))
    choices: list[_Choice] = field(default_factory=list)

    def usage(self) -> Usage:
        # a prompt counts once however many choices it has (as OpenAI bills it)
        prompt = sum(c.prompt_tokens for c in self.choices[::self.n])
        cached = sum(c.cached_tokens for c in self.choices[::self.n])
        completion = sum(c.completion_tokens for c in self.choices)
        return Usage(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion,
                     prompt_tokens_details={"cached_tokens": cached})


class OpenAIServing:
    """Builds OpenAI responses (whole, or as SSE byte chunks) from request streams."""

    def __init__(self, tm: TokenizerManager, model_names: tuple[str, ...]) -> None:
        self.tm = tm
        self.model_names = model_names

    def check_model(self, name: str) -> None:
        if name not in self.model_names:
            raise ApiError(404, f"The model `{name}` does not exist; this server has "
                                f"{list(self.model_names)}", code="model_not_found", param="model")

    async def completions(self, req: CompletionRequest,
                          guard: Guard) -> msgspec.Struct | EventStream:
        self.check_model(req.model)
        check_completion(req)
        prompts = prompt_list(req.prompt)
        max_tokens = COMPLETION_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        params = to_params(req, max_tokens)
        params.logprobs = req.logprobs is not None
        call = _Call(f"cmpl-{uuid.uuid4().hex}", False, req.model, req.n, params.logprobs,
                     req.include_usage)
        return await self._run(call, prompts, params, req.stream, guard)

    async def chat(self, req: ChatCompletionRequest,
                   guard: Guard) -> msgspec.Struct | EventStream:
        self.check_model(req.model)
        check_chat(req)
        ids = await self.tm.tokenize(chat_prompt_text(self.tm.tokenizer, req.messages),
                                     add_special_tokens=False)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None \
            else req.max_tokens
        if max_tokens is None:  # OpenAI: as much as the context leaves
            max_tokens = max(1, self.tm.context_len - len(ids))
        params = to_params(req, max_tokens)
        params.logprobs = req.logprobs
        call = _Call(f"chatcmpl-{uuid.uuid4().hex}", True, req.model, req.n, req.logprobs,
                     req.include_usage)
        return await self._run(call, [ids], params, req.stream, guard)

    # ------------------------------------------------------------ running
    async def _run(self, call: _Call, prompts: list[str | list[int]], params: SamplingParams,
                   stream: bool, guard: Guard) -> msgspec.Struct | EventStream:
        gens = []
        for p, prompt in enumerate(prompts):
            for i in range(call.n):
                choice_params = msgspec.structs.replace(params)
                if params.seed is not None:
                    choice_params.seed = params.seed + i
                gens.append(self.tm.generate(prompt, choice_params, f"{call.id}-{p * call.n + i}"))
        call.choices = [_Choice() for _ in gens]
        streams, first = await start_streams(gens, guard)
        if stream:
            return EventStream(self._events(call, streams, first), streams)
        try:
            for index, chunk in [first] + await guard(collect(streams)):
                call.choices[index].add(chunk)
        finally:
            await streams.aclose()
        return self._response(call)

    async def _events(self, call: _Call, streams: MergedStreams,
                      first: tuple[int, Chunk]) -> AsyncIterator[bytes]:
        """The SSE body: chunks as they come, the usage chunk if asked, then `[DONE]`."""
        try:
            if call.chat:  # the assistant's role first, for every choice
                yield sse(ChatCompletionChunk(id=call.id, created=call.created, model=call.model,
                                              choices=[ChatStreamChoice(
                                                  index=i, delta=ChatDelta(role="assistant",
                                                                           content=""))
                                                  for i in range(len(call.choices))]))
            index, chunk = first
            while True:
                call.choices[index].add(chunk)
                yield sse(self._chunk(call, index, chunk))
                nxt = await anext(streams, None)
                if nxt is None:
                    break
                index, chunk = nxt
            if call.include_usage:
                yield sse(self._usage_chunk(call))
        except Exception as e:  # the response has started: the error is the last event
            log.warning("stream %s ended with an error: %r", call.id, e)
            yield sse(api_error(e).body())
        finally:
            await streams.aclose()
        yield DONE

    # ------------------------------------------------------------ formatting
    def _chunk(self, call: _Call, index: int, chunk: Chunk) -> msgspec.Struct:
        if call.chat:
            delta = ChatDelta(content=chunk.text) if chunk.text or not chunk.finish_reason \
                else ChatDelta()
            logprobs = self._chat_logprobs(chunk.token_ids, chunk.logprobs) \
                if call.logprobs else None
            return ChatCompletionChunk(
                id=call.id, created=call.created, model=call.model,
                choices=[ChatStreamChoice(index=index, delta=delta, logprobs=logprobs,
                                          finish_reason=chunk.finish_reason)])
        logprobs = self._completion_logprobs(chunk.token_ids, chunk.logprobs) \
            if call.logprobs else None
        return CompletionResponse(
            id=call.id, created=call.created, model=call.model,
            choices=[CompletionChoice(index=index, text=chunk.text, logprobs=logprobs,
                                      finish_reason=chunk.finish_reason)])

    def _usage_chunk(self, call: _Call) -> msgspec.Struct:
        cls = ChatCompletionChunk if call.chat else CompletionResponse
        return cls(id=call.id, created=call.created, model=call.model, choices=[],
                   usage=call.usage())

    def _response(self, call: _Call) -> msgspec.Struct:
        if call.chat:
            return ChatCompletionResponse(
                id=call.id, created=call.created, model=call.model, usage=call.usage(),
                choices=[ChatChoice(
                    index=i, message=AssistantMessage(content="".join(c.text)),
                    logprobs=self._chat_logprobs(c.token_ids, c.logprobs)
                    if call.logprobs else None,
                    finish_reason=c.finish_reason) for i, c in enumerate(call.choices)])
        return CompletionResponse(
            id=call.id, created=call.created, model=call.model, usage=call.usage(),
            choices=[CompletionChoice(
                index=i, text="".join(c.text),
                logprobs=self._completion_logprobs(c.token_ids, c.logprobs)
                if call.logprobs else None,
                finish_reason=c.finish_reason) for i, c in enumerate(call.choices)])

    def _token_text(self, token_id: int) -> str:
        tok = self.tm.tokenizer
        return str(token_id) if tok is None else tok.decode([token_id])

    def _completion_logprobs(self, ids: list[int], lps: list[float]) -> CompletionLogprobs:
        tokens = [self._token_text(t) for t in ids]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return CompletionLogprobs(tokens=tokens, token_logprobs=lps, text_offset=offsets)

    def _chat_logprobs(self, ids: list[int], lps: list[float]) -> ChatLogprobs:
        content = []
        for t, lp in zip(ids, lps):
            text = self._token_text(t)
            content.append(TokenLogprob(token=text, logprob=lp, bytes=list(text.encode())))
        return ChatLogprobs(content=content)

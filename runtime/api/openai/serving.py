"""`OpenAIServing`: `/v1/completions` and `/v1/chat/completions` over the TokenizerManager.

Each choice (n per prompt) runs as its own request (`rid = <response id>-<choice>`, seed
+ choice when a seed is given); their streams are merged. A call is admitted whole: all
its choices count against the per-request cap and the queue (see `api/admission.py`).
The first chunk is awaited before anything is returned, so a request rejected by
validation, by the queue limit or by the scheduler still gets a proper HTTP status;
after that, a stream ends with an error event and `[DONE]`.

Completions with `echo` return the prompt before each choice's text (in a stream, in its
first chunk); with `logprobs` too, the prompt's tokens and logprobs come first in the
choice's `logprobs` (see `logprobs`): the prompt is tokenized here, so its first
token is known, and scored from position 0 (`SamplingParams.logprob_start_len`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.api.openai.chat_output import ChatOutput
from runtime.api.openai.chat_parsing import ChatParsing
from runtime.api.openai.logprobs import (
    chat_logprobs,
    completion_logprobs,
    output_tokens,
    prompt_tokens,
)
from runtime.api.openai.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    api_error,
    check_chat,
    check_completion,
    given_fields,
    prompt_list,
    to_params,
)
from runtime.api.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatStreamChoice,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Usage,
)
from runtime.api.streams import EventStream, Guard, MergedStreams, collect, start_streams
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.wire.request_output import RequestOutput
from runtime.wire.sampling import SamplingParams

log = logging.getLogger(__name__)
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DONE = b"data: [DONE]\n\n"
_JSON = msgspec.json.Encoder()  # one encoder for every event of every stream


def sse(payload: Any) -> bytes:
    """One server-sent event carrying `payload` as JSON."""
    return b"data: %b\n\n" % _JSON.encode(payload)


@dataclass
class _Call:
    """One OpenAI call in progress: `len(prompts) * n` choices, each one request.

    `outputs[i]` is choice i's latest output: the whole of it when not streamed, its last
    delta in a stream (whose counters are totals all the same)."""

    id: str
    chat: bool
    model: str
    n: int
    logprobs: bool
    include_usage: bool
    created: int = field(default_factory=lambda: int(time.time()))
    outputs: list[RequestOutput] = field(default_factory=list)
    chars: list[int] = field(default_factory=list)  # each choice's streamed text length
    top: int = 0  # completions' logprobs=N: alternatives per token
    given: frozenset[str] = frozenset()  # the sampling fields the request set
    # with echo: per choice, its prompt's text and ids, until its first piece took them
    echo: list[tuple[str, list[int]] | None] = field(default_factory=list)
    # chat with tools or reasoning: per choice, the reader of its output
    readers: list[ChatOutput] = field(default_factory=list)

    def usage(self) -> Usage:
        # a prompt counts once however many choices it has (as OpenAI bills it)
        prompt = sum(o.prompt_tokens for o in self.outputs[::self.n])
        cached = sum(o.cached_tokens for o in self.outputs[::self.n])
        completion = sum(o.completion_tokens for o in self.outputs)
        return Usage(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion,
                     prompt_tokens_details={"cached_tokens": cached})


class OpenAIServing:
    """Builds OpenAI responses (whole, or as SSE byte chunks) from request streams."""

    def __init__(self, tm: TokenizerManager, model_names: tuple[str, ...]) -> None:
        self.tm = tm
        self.model_names = model_names
        self.parsing = ChatParsing(tm.cfg, tm.tokenizer)

    def check_model(self, name: str) -> str | None:
        """The LoRA adapter that model `name` picks: None for the base model, the adapter
        for `"<adapter>"` or `"<base>:<adapter>"`. An unknown adapter of the base is a
        400, any other unknown name a 404 (both naming `model`)."""
        if name in self.model_names:
            return None
        if name in self.tm.lora_names:
            return name
        for base in self.model_names:
            if name.startswith(base + ":"):
                adapter = name[len(base) + 1:]
                if adapter not in self.tm.lora_names:
                    raise ApiError(400, f"model: unknown LoRA adapter {adapter!r} of `{base}`; "
                                        f"this server has {list(self.tm.lora_names)}",
                                   param="model")
                return adapter
        raise ApiError(404, f"The model `{name}` does not exist; this server has "
                            f"{[*self.model_names, *self.tm.lora_names]}",
                       code="model_not_found", param="model")

    async def completions(self, req: CompletionRequest,
                          guard: Guard) -> msgspec.Struct | EventStream:
        lora = self.check_model(req.model)
        check_completion(req)
        prompts = prompt_list(req.prompt)
        max_tokens = COMPLETION_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        params = to_params(req, max_tokens)
        params.lora = lora
        params.logprobs = req.logprobs is not None
        params.top_logprobs = req.logprobs or 0
        call = _Call(f"cmpl-{uuid.uuid4().hex}", False, req.model, req.n, params.logprobs,
                     req.include_usage, top=params.top_logprobs, given=given_fields(req))
        if req.echo:
            prompts = [await self._echo_prompt(call, p) for p in prompts]
            if params.logprobs:
                params.logprob_start_len = 0
        return await self._run(call, prompts, params, req.stream, guard)

    async def _echo_prompt(self, call: _Call, prompt: str | list[int]) -> list[int]:
        """Record `prompt`'s text and ids for each of its choices to echo; its ids."""
        if isinstance(prompt, str):
            text, ids = prompt, await self.tm.tokenize(prompt)
        else:
            tok = self.tm.tokenizer
            text, ids = ("" if tok is None else tok.decode(prompt)), prompt
        call.echo += [(text, ids)] * call.n
        return ids

    async def chat(self, req: ChatCompletionRequest,
                   guard: Guard) -> msgspec.Struct | EventStream:
        lora = self.check_model(req.model)
        check_chat(req)
        parsing = self.parsing.request(req)
        tools = parsing.template_tools
        text = await self.tm.chat_text(req.messages, tools, req.chat_template_kwargs,
                                       len(msgspec.json.encode(tools)) if tools else 0)
        ids = await self.tm.tokenize(text, add_special_tokens=False)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None \
            else req.max_tokens
        if max_tokens is None:  # OpenAI: as much as the context leaves
            max_tokens = max(1, self.tm.context_len - len(ids))
        params = to_params(req, max_tokens)
        params.lora = lora
        params.logprobs = req.logprobs
        params.top_logprobs = req.top_logprobs or 0
        parsing.apply(params)
        call = _Call(f"chatcmpl-{uuid.uuid4().hex}", True, req.model, req.n, req.logprobs,
                     req.include_usage, given=given_fields(req))
        readers = [parsing.output() for _ in range(req.n)]
        call.readers = readers if readers[0] is not None else []
        return await self._run(call, [ids], params, req.stream, guard)

    # ------------------------------------------------------------ running
    async def _run(self, call: _Call, prompts: list[str | list[int]], params: SamplingParams,
                   stream: bool, guard: Guard) -> msgspec.Struct | EventStream:
        await self.tm.admit(len(prompts) * call.n)
        gens = []
        for p, prompt in enumerate(prompts):
            for i in range(call.n):
                choice_params = msgspec.structs.replace(params)
                if params.seed is not None:
                    choice_params.seed = params.seed + i
                rid = f"{call.id}-{p * call.n + i}"
                gens.append(self.tm.generate(prompt, choice_params, rid, stream=stream,
                                             given=call.given))
                call.outputs.append(RequestOutput(rid=rid))
                call.chars.append(0)
        streams, first = await start_streams(gens, guard)
        if stream:
            return EventStream(self._events(call, streams, first), streams)
        try:
            for index, out in [first] + await guard(collect(streams)):
                call.outputs[index] = out
        finally:
            await streams.aclose()
        return self._response(call)

    async def _events(self, call: _Call, streams: MergedStreams,
                      first: tuple[int, RequestOutput]) -> AsyncIterator[bytes]:
        """The SSE body: chunks as they come, the usage chunk if asked, then `[DONE]`."""
        try:
            if call.chat:  # the assistant's role first, for every choice
                yield sse(ChatCompletionChunk(id=call.id, created=call.created, model=call.model,
                                              choices=[ChatStreamChoice(
                                                  index=i, delta=ChatDelta(role="assistant",
                                                                           content=""))
                                                  for i in range(len(call.outputs))]))
            index, out = first
            while True:
                call.outputs[index] = out
                for chunk in self._chunks(call, index, out):
                    yield sse(chunk)
                nxt = await anext(streams, None)
                if nxt is None:
                    break
                index, out = nxt
            if call.include_usage:
                yield sse(self._usage_chunk(call))
        except Exception as e:  # the response has started: the error is the last event
            log.warning("stream %s ended with an error: %r", call.id, e)
            yield sse(api_error(e).body())
        finally:
            await streams.aclose()
        yield DONE

    # ------------------------------------------------------------ formatting
    def _chunks(self, call: _Call, index: int, delta: RequestOutput) -> list[msgspec.Struct]:
        """The streamed events of one choice's delta: one, or (a chat with a reader) one
        per part, the finish reason and logprobs on the last."""
        if not call.chat:
            return [self._chunk(call, index, delta)]
        if call.readers:
            reader = call.readers[index]
            deltas, finish = reader.deltas(delta), reader.finish_reason(delta)
        else:
            deltas = [ChatDelta(content=delta.text) if delta.text or not delta.finished
                      else ChatDelta()]
            finish = delta.finish_reason
        logprobs = chat_logprobs(delta, self._token_text) if call.logprobs else None
        chunks = []
        for i, d in enumerate(deltas):
            last = i == len(deltas) - 1
            chunks.append(ChatCompletionChunk(
                id=call.id, created=call.created, model=call.model,
                choices=[ChatStreamChoice(index=index, delta=d,
                                          logprobs=logprobs if last else None,
                                          finish_reason=finish if last else None)]))
        return chunks

    def _chunk(self, call: _Call, index: int, delta: RequestOutput) -> msgspec.Struct:
        """One streamed completions event, from one choice's delta."""
        # offsets run over the whole completion: this delta starts where the text so far ends
        text, logprobs = self._completion_text(call, index, delta, call.chars[index])
        call.chars[index] += len(text)
        return CompletionResponse(
            id=call.id, created=call.created, model=call.model,
            choices=[CompletionChoice(index=index, text=text, logprobs=logprobs,
                                      finish_reason=delta.finish_reason)])

    def _usage_chunk(self, call: _Call) -> msgspec.Struct:
        cls = ChatCompletionChunk if call.chat else CompletionResponse
        return cls(id=call.id, created=call.created, model=call.model, choices=[],
                   usage=call.usage())

    def _response(self, call: _Call) -> msgspec.Struct:
        """The whole response, from every choice's whole output."""
        if call.chat:
            choices = []
            for i, o in enumerate(call.outputs):
                message, finish = call.readers[i].message(o) if call.readers else (
                    AssistantMessage(role="assistant", content=o.text), o.finish_reason)
                choices.append(ChatChoice(
                    index=i, message=message, finish_reason=finish,
                    logprobs=chat_logprobs(o, self._token_text) if call.logprobs else None))
            return ChatCompletionResponse(id=call.id, created=call.created, model=call.model,
                                          usage=call.usage(), choices=choices)
        choices = []
        for i, o in enumerate(call.outputs):
            text, logprobs = self._completion_text(call, i, o, 0)
            choices.append(CompletionChoice(index=i, text=text, logprobs=logprobs,
                                            finish_reason=o.finish_reason))
        return CompletionResponse(id=call.id, created=call.created, model=call.model,
                                  usage=call.usage(), choices=choices)

    def _completion_text(self, call: _Call, index: int, out: RequestOutput,
                         start: int) -> tuple[str, CompletionLogprobs | None]:
        """Choice `index`'s text and logprobs in `out` (a delta starting at offset `start`,
        or the whole output at 0): the echoed prompt first, in its first piece."""
        text, tokens, echo = out.text, [], None
        if call.echo:
            echo, call.echo[index] = call.echo[index], None
            if echo is not None:
                text = echo[0] + text
            if call.logprobs:
                tokens = prompt_tokens(out, echo[1][0] if echo is not None else None)
        if not call.logprobs:
            return text, None
        tokens += output_tokens(out)
        return text, completion_logprobs(tokens, self._token_text, start, call.top)

    def _token_text(self, token_id: int) -> str:
        tok = self.tm.tokenizer
        return str(token_id) if tok is None else tok.decode([token_id])

